"""The local broker's cluster ids: Kafka's form, and never a leading ``-`` (the storage tool
reads such an id as an option and refuses to format, so one start in 64 would fail)."""
from __future__ import annotations

import base64
import re

from jvm.kafka_local import BrokerDir, new_cluster_id


def test_cluster_ids_are_16_bytes_of_url_safe_base64_never_starting_with_a_dash():
    ids = [new_cluster_id() for _ in range(5000)]  # ~78 would start with '-' if not excluded
    assert len(set(ids)) == len(ids)
    for made in ids:
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", made), made
        assert len(base64.urlsafe_b64decode(made + "==")) == 16


def test_a_directory_keeps_its_cluster_id(tmp_path):
    first = BrokerDir(tmp_path).cluster_id()
    assert BrokerDir(tmp_path).cluster_id() == first
