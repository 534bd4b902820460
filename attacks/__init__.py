"""Gradient-leakage attacks; importing this package registers every attack."""

from leakbench.attacks import analytic, dlg, idlg, ig  # noqa: F401  (registration)
from leakbench.attacks.base import ATTACKS, Attack, AttackTarget, Reconstruction, make_attack

__all__ = ["ATTACKS", "Attack", "AttackTarget", "Reconstruction", "make_attack"]
