"""The one table of display names for methods (composers) and expansions, used by the UI, compare mode,
the CLI and the training reports."""
from __future__ import annotations

METHOD_LABELS = {
    "image": "Image only",
    "text": "Text only",
    "sum": "Image + text (weighted sum)",
    "context-i2w": "Context-I2W",
    "rtic": "RTIC",
    "rtic+gcn": "RTIC+GCN",
    "auto": "Automatic",
}
EXPAND_LABELS = {
    "none": "No expansion",
    "aqe": "AQE",
    "aqewd": "AQEwD",
    "alpha-qe": "α-QE",
    "lattqe": "LAttQE",
    "lattqe-text": "LAttQE with the text",
    "dba": "DBA",
    "adba": "ADBA",
    "alpha-dba": "α-DBA",
    "lattdba": "LAttDBA",
}


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def expand_label(name: str) -> str:
    """``aqe`` -> AQE; a chain such as ``adba+aqe`` -> ADBA + AQE."""
    return " + ".join(EXPAND_LABELS.get(part, part) for part in str(name).split("+"))
