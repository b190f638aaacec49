"""Metric names a PromQL expression reads (for checking shipped queries against /metrics)."""

from __future__ import annotations

import re

_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
     "bool", "offset", "inf", "nan"}
)  # fmt: skip
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Every metric name in `expr`: identifiers that are not functions, keywords, label
    names (inside braces or grouping lists), strings, durations or Grafana variables."""
    grafana = re.findall(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)", expr)
    if grafana:
        return set(grafana)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group()
        rest = text[m.end() :].lstrip()
        if word.lower() in _KEYWORDS or rest.startswith("("):
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # an exponent or unit of a number literal
        names.add(word)
    return names
