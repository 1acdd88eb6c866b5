"""Spark adapters around the engine-free core: state and events in, rows and a timer out.

* ``group_state``: ``applyInPandasWithState`` (flatMapGroupsWithState), state as one Avro blob.
* ``processor``: a ``StatefulProcessor`` for ``transformWithState``, state as list/value state.
* ``frames``: the conversions between Spark's pandas/Row data and the core's types.
"""
