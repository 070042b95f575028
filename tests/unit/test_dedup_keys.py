from __future__ import annotations

import itertools
from datetime import UTC, datetime

from app.ids import RESERVED, SEPARATOR, intake_key, key_id_problem
from app.schedules.fires import dedup_key as fire_key

# Key ids an operator might configure, the ambiguous and the reserved among them.
KEY_IDS = ["shop", "shop:1", "shop-1", "schedule", "Schedule", "dev", "bench", "replay", "a.b_c"]
NONCES = ["abc", "1:abc", ":", "", "daily:2026-01-01T00:00:00+00:00", "x" * 128]


def test_no_accepted_key_id_and_nonce_spell_another_pair_or_an_internal_key():
    accepted = [key_id for key_id in KEY_IDS if key_id_problem(key_id) is None]
    assert accepted == ["shop", "shop-1", "a.b_c"]
    pairs = list(itertools.product(accepted, NONCES))
    keys = [intake_key(key_id, nonce) for key_id, nonce in pairs]
    assert len(set(keys)) == len(pairs)
    # Each key names its pair back: the key id ends at the first separator.
    assert [tuple(key.split(SEPARATOR, 1)) for key in keys] == pairs
    fire = fire_key("daily", datetime(2026, 1, 1, tzinfo=UTC))
    assert fire == "schedule:daily:2026-01-01T00:00:00+00:00"
    assert not any(key.split(SEPARATOR, 1)[0].lower() in RESERVED for key in keys)
    assert fire not in keys
