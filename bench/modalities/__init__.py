"""The modalities of the one pipeline (`leakbench.modalities.base.Modality`): images and text."""

from leakbench.modalities.base import Modality, Step
from leakbench.modalities.image import IMAGE, ImageModality
from leakbench.modalities.text import TEXT, TextModality, read_tokens, text_gradients

__all__ = [
    "IMAGE",
    "TEXT",
    "ImageModality",
    "Modality",
    "Step",
    "TextModality",
    "read_tokens",
    "text_gradients",
]
