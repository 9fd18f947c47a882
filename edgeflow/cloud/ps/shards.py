"""Which parameter-server shard holds which variable (as TensorFlow's ps tasks split a
model's variables): pure, no Ray here.

A shard applies the optimizer updates of its variables alone, so each shard's update must
be closed (TrainingRoles.check_update_closed): it may read only its own variables, their
slots, their gradients and constants. Variables whose updates touch the same state (a slot
or step counter shared by an optimizer, another served variable, another's gradient) are
grouped first (union-find over what their update ops read and write); the groups are then
dealt out to at most `n` shards by bytes (variables and slots), largest first, each to the
lightest shard so far. The answer depends only on the package and `n`.
"""
import numpy as np

from ...errors import InvalidInputError


def groups(roles, names):
    """`names` (served variables of TrainingRoles `roles`) in groups whose updates share no
    state, each group and the groups in the order of `names`."""
    index = {t.name: i for i, t in enumerate(roles.tensors)}
    gradients = {index[roles.roles[n].gradient] for n in names}
    producer = {t: i for i, op in enumerate(roles.operators) for t in op.outputs}
    parent = {n: n for n in names}

    def find(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n
    owner = {}  # a state tensor (variable or gradient) -> the first name whose update touches it
    for name in names:
        seen, todo = set(), [t for op in roles.roles[name].assigns for t in roles.operators[op].inputs]
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if roles.tensors[t].is_variable or t in gradients:
                parent[find(name)] = find(owner.setdefault(t, name))
            elif t in producer:
                todo.extend(roles.operators[producer[t]].inputs)
    found = {}
    for name in names:
        found.setdefault(find(name), []).append(name)
    return list(found.values())


def nbytes(roles, names):
    """Bytes of the variables `names` and their optimizer slots."""
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
               for dtype, shape in map(roles.spec, dict.fromkeys(list(names) + roles.slots_of(names))))


def assign(roles, names, n):
    """`names` split into at most `n` shards (lists of names, each in the order of `names`;
    no shard empty): groups that share update state stay in one shard, and the groups go,
    largest first (by bytes; ties: in the order of `names`), each to the shard with the
    fewest bytes so far (ties: the lowest index)."""
    if not isinstance(n, int) or n < 1:
        raise InvalidInputError(f"shards: expected an int >= 1, got {n!r}")
    found = groups(roles, names)
    sizes = [nbytes(roles, g) for g in found]
    shards = [[] for _ in range(min(n, len(found)))]
    loads = [0] * len(shards)
    for k in sorted(range(len(found)), key=lambda k: (-sizes[k], k)):
        lightest = loads.index(min(loads))
        shards[lightest].extend(found[k])
        loads[lightest] += sizes[k]
    order = {name: i for i, name in enumerate(names)}
    return [sorted(shard, key=order.get) for shard in shards]
