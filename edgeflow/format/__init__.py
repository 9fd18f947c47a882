"""The `.efl` file: schema, generated FlatBuffers code, writer, zero-copy reader, verifier."""
