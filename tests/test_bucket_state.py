"""The bucket state of the applyInPandasWithState backend: its encoding and its versions."""
import io

import fastavro

from attribution.backends.group_state import (_BUCKET_SCHEMA_V1, BUCKET_STATE_VERSION,
                                              decode_bucket, encode_bucket)
from attribution.core import UserAttribution
from attribution.events import Event


def _user_blob() -> bytes:
    core = UserAttribution("u1")
    core.add([Event("v1", "u1", "visit", 1_000, url="/a", referer="/home")])
    return core.to_bytes()


def test_a_bucket_round_trips_with_inboxes_and_is_compressed():
    users = {f"u{i}": {"wakeup": 10 + i, "state": _user_blob(),
                       "inbox": '{"i":"e1","t":"visit","s":5,"u":"/a"}'} for i in range(200)}
    blob = encode_bucket(users)
    assert blob[0] == BUCKET_STATE_VERSION
    assert decode_bucket(blob) == users
    # 200 near-identical users: compression must make the bucket far smaller than its parts.
    raw = sum(len(u["state"]) + len(u["inbox"]) for u in users.values())
    assert len(blob) < raw / 5


def test_a_version_1_bucket_still_reads_with_empty_inboxes():
    buf = io.BytesIO()
    buf.write(bytes([1]))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(_BUCKET_SCHEMA_V1),
                               {"users": {"u1": {"wakeup": 7, "state": _user_blob()}}})
    assert decode_bucket(buf.getvalue()) == {"u1": {"wakeup": 7, "state": _user_blob(),
                                                    "inbox": ""}}


def test_an_unknown_bucket_version_is_refused_with_the_versions_this_code_reads():
    import pytest

    with pytest.raises(ValueError, match="unknown bucket state version"):
        decode_bucket(bytes([99]) + b"whatever")
