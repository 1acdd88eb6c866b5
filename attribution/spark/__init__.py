"""Everything Spark for attribution: readers, validation, the pipeline, the two stateful backends,
the checkpoint layout and the Spark/pandas/Arrow types derived from the Avro schemas.

The rules themselves live in the engine-free core (``attribution``); the adapters here stay thin:
state and events in, rows and a timer out.
"""
