"""The text attacks: recover a client's private token sequences from its dense gradient.

Importing this package (which `leakbench.attacks` does) registers every text attack in the one
attack registry, `leakbench.attacks.ATTACKS`, with ``modality = "text"``. The contract is the
attacks' (`leakbench.attacks.base.AttackContract`); its text base, target and result are in
`leakbench.attacks.text.base`; the standard text suite is `leakbench.attacks.text.suite`.
Adding a built-in text attack is one new module in this folder with one
``@ATTACKS.register(...)`` `TextAttack` subclass (docs/text.md).
"""

from __future__ import annotations

from leakbench.attacks.text.base import (
    TEXT_STOP_REASONS,
    TextAttack,
    TextReconstruction,
    TextResult,
    TextTarget,
)
from leakbench.core.discovery import import_parts

import_parts(__name__, __path__)

__all__ = ["TEXT_STOP_REASONS", "TextAttack", "TextReconstruction", "TextResult", "TextTarget"]
