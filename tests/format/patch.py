"""Corrupts chosen fields of a valid `.efl` file, found with the generated accessors
(a reader independent of the verifier) and the field layout of schema.fbs."""
import struct

from edgeflow.format.efl.Model import Model

from .fbs import voffset


class Patcher:
    def __init__(self, data):
        self.buf = bytearray(data)
        self.model = Model.GetRootAs(self.buf, 4)  # 4: past the size prefix

    def bytes(self):
        return bytes(self.buf)

    def at(self, obj, table, field):
        """Absolute position of a field that the file holds (non-default)."""
        o = obj._tab.Offset(voffset(table, field))
        assert o, f"{table}.{field} is not in the file; give it a non-default value"
        return obj._tab.Pos + o

    def set(self, obj, table, field, fmt, value):
        struct.pack_into("<" + fmt, self.buf, self.at(obj, table, field), value)

    def target(self, obj, table, field):
        """Position of the string or vector (its length word) that a field points to."""
        at = self.at(obj, table, field)
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def set_string(self, obj, table, field, text):
        at = self.target(obj, table, field)
        raw = text.encode()
        assert len(raw) == struct.unpack_from("<I", self.buf, at)[0], "same length only"
        self.buf[at + 4:at + 4 + len(raw)] = raw

    def set_length(self, obj, table, field, n):
        struct.pack_into("<I", self.buf, self.target(obj, table, field), n)

    def set_vector_item(self, obj, table, field, index, fmt, value):
        at = self.target(obj, table, field) + 4 + index * struct.calcsize("<" + fmt)
        struct.pack_into("<" + fmt, self.buf, at, value)

    def tensor(self, subgraph, name):
        sg = self.model.Subgraphs(subgraph)
        return next(sg.Tensors(k) for k in range(sg.TensorsLength())
                    if sg.Tensors(k).Name().decode() == name)
