"""The fixed rules the offline sets are built by and their readers share: the splits, the stable hash that
assigns a group to one, and the category noun of each photo source's label paths.

A leaf of ``engine.data`` (standard library only): the open-vocabulary set (``engine.data.open_vocab``) and
the held-out suite (``engine.eval.generalise``) read these rules without loading the builders.
"""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

SPLITS = ("train", "val", "test")
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)

# (source, label-path prefix or None, file-name regex or None) -> category noun.
# Categories are chosen to be mutually exclusive so every gallery photo has exactly one.
CATEGORY_RULES: list[tuple[str, Optional[str], Optional[str], str]] = [
    ("tuxpaint-stamps-default", "animals/birds", None, "bird"),
    ("tuxpaint-stamps-default", "animals/fish", None, "fish"),
    ("tuxpaint-stamps-default", "animals/insects", None, "insect"),
    ("tuxpaint-stamps-default", "animals/mammals", None, "mammal"),
    ("tuxpaint-stamps-default", "animals/marsupials", None, "mammal"),
    ("tuxpaint-stamps-default", "food/fruit", None, "fruit"),
    ("tuxpaint-stamps-default", "food/vegetables", None, "vegetable"),
    ("tuxpaint-stamps-default", "food/nuts", None, "nut"),
    ("tuxpaint-stamps-default", "plants/flowers", None, "flower"),
    ("tuxpaint-stamps-default", "plants/trees", None, "tree"),
    ("tuxpaint-stamps-default", "plants/mushrooms", None, "mushroom"),
    ("tuxpaint-stamps-default", "hobbies/music", None, "musical instrument"),
    ("tuxpaint-stamps-default", "household/tools", None, "tool"),
    ("tuxpaint-stamps-default", "clothes/hats", None, "hat"),
    ("tuxpaint-stamps-default", "vehicles", None, "vehicle"),
    ("tuxpaint-stamps-default", "military/vehicles", None, "vehicle"),
    ("tuxpaint-stamps-default", "town/roadsigns", None, "road sign"),
    ("tuxpaint-stamps-default", "town/flags", None, "flag"),
    ("tuxpaint-stamps-default", "town/monuments", None, "monument"),
    ("tuxpaint-stamps-default", "space/planets", None, "planet"),
    ("tuxpaint-stamps-default", "symbols/money", r"coin|penny|nickel|dime|quarter|dollar|loonie|toonie|euro|cent|yen", "coin"),
    ("gcompris-qt-data", "categorization/fishes", None, "fish"),
    ("gcompris-qt-data", "clickgame", None, "fish"),
    ("gcompris-qt-data", "categorization/tools", None, "tool"),
    ("gcompris-qt-data", "categorization/monuments", None, "monument"),
    ("gcompris-qt-data", "explore_monuments", None, "monument"),
    ("gcompris-qt-data", "categorization/renewable", None, "renewable energy installation"),
    ("gcompris-qt-data", "solar_system", None, "planet"),
    ("saleor", "T-shirts", None, "t-shirt"),
    ("saleor", "Polo Shirts", None, "polo shirt"),
    ("saleor", "Hoodies", None, "hoodie"),
    ("saleor", "Footwear", None, "shoe"),
    ("saleor", "Alcohol", None, "bottle of alcohol"),
    ("saleor", "Juices", None, "bottle of juice"),
    ("saleor", "Paints", None, "can of paint"),
]


def unit_hash(seed: int, key: str) -> float:
    """Deterministic number in [0, 1) from (seed, key)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def assign_split(group: str, seed: int, fractions: Sequence[float] = SPLIT_FRACTIONS) -> str:
    """train / val / test for a group key; the same key and seed always give the same split."""
    u = unit_hash(seed, group)
    acc = 0.0
    for name, frac in zip(SPLITS, fractions):
        acc += frac
        if u < acc:
            return name
    return SPLITS[-1]
