"""The bucket state of the applyInPandasWithState backend: its encoding and its versions."""
import io
import pickle

import fastavro
import pytest

from attribution.core import UserAttribution
from attribution.events import Event
from attribution.spark.apply_in_pandas import (
    _BUCKET_SCHEMA_V1,
    _CODEC,
    BUCKET_STATE_VERSION,
    decode_bucket,
    encode_bucket,
)


def _user_blob() -> bytes:
    core = UserAttribution("u1")
    core.add([Event("v1", "u1", "visit", 1_000, url="/a", referer="/home")])
    return core.to_bytes()


def test_a_bucket_round_trips_with_inboxes_and_is_compressed():
    users = {f"u{i}": (10 + i, _user_blob(), '{"i":"e1","t":"visit","s":5,"u":"/a"}')
             for i in range(200)}
    blob = encode_bucket(users, 12_345)
    assert blob[0] == BUCKET_STATE_VERSION
    assert decode_bucket(blob) == (users, 12_345)
    assert decode_bucket(encode_bucket(users)) == (users, None)
    # 200 near-identical users: compression must make the bucket far smaller than its parts.
    raw = sum(len(state) + len(inbox) for _, state, inbox in users.values())
    assert len(blob) < raw / 5


def test_a_version_1_bucket_still_reads_with_empty_inboxes():
    buf = io.BytesIO()
    buf.write(bytes([1]))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(_BUCKET_SCHEMA_V1),
                               {"users": {"u1": {"wakeup": 7, "state": _user_blob()}}})
    assert decode_bucket(buf.getvalue()) == ({"u1": (7, _user_blob(), "")}, None)


def test_a_version_2_bucket_still_reads_without_a_watermark():
    users = {"u1": (7, _user_blob(), '{"i":"e1","t":"visit","s":5,"u":"/a"}')}
    raw = pickle.dumps(users, protocol=5)
    blob = bytes([2]) + len(raw).to_bytes(4, "little") + _CODEC.compress(raw, asbytes=True)
    assert decode_bucket(blob) == (users, None)


def test_an_unknown_bucket_version_is_refused_with_the_versions_this_code_reads():
    with pytest.raises(ValueError, match="unknown bucket state version"):
        decode_bucket(bytes([99]) + b"whatever")


def test_a_bucket_naming_a_class_is_refused_not_executed():
    raw = pickle.dumps(UserAttribution("u1"))
    forged = (bytes([BUCKET_STATE_VERSION]) + len(raw).to_bytes(4, "little")
              + _CODEC.compress(raw, asbytes=True))
    with pytest.raises(pickle.UnpicklingError, match="may not reference"):
        decode_bucket(forged)
