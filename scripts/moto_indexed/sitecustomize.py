"""moto for long benchmarks (examples/long_session.rs): DynamoDB with the costs of a real table.

Loaded by Python at start (a `sitecustomize` on PYTHONPATH) when the benchmark starts its moto
server. It changes how moto does two things, not what they answer:

- A `TransactWriteItems` deep-copies the whole table once per item, to restore it if the
  transaction is cancelled: a 20,000-item table takes seconds per commit. Here the transaction
  copies the items it names, and restores those on failure: the same outcome.
- A `Query` on the table sorts every item of the table and scans them all: here it sees only the
  items of the partition it asks for whose sort key can meet the key condition, a superset of
  what it returns (moto still applies the condition, the filter, the limit and the paging).

Every other request, and every answer, is moto's own. Tests never load this.
"""

import copy
import threading

from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

_local = threading.local()

# ---------------------------------------------------------------------------------------------
# Transactions: back up the named items, not the table
# ---------------------------------------------------------------------------------------------


def _table_deepcopy(self, memo):
    # Inside a transaction the backup is the named items (below): the table stands for itself.
    if getattr(_local, "in_transaction", False):
        return self
    clone = self.__class__.__new__(self.__class__)
    memo[id(self)] = clone
    for name, value in self.__dict__.items():
        setattr(clone, name, copy.deepcopy(value, memo))
    return clone


Table.__deepcopy__ = _table_deepcopy

_transact_write_items = DynamoDBBackend.transact_write_items


def _key_of(table, op_type, op):
    attrs = op["Item"] if op_type == "Put" else op["Key"]
    hash_key = DynamoType(attrs[table.hash_key_attr])
    range_key = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr else None
    return hash_key, range_key


def transact_write_items(self, transact_items):
    saved = []
    for item in transact_items:
        try:
            op_type, op = next(iter(item.items()))
            table = self.tables[op["TableName"]]
            hash_key, range_key = _key_of(table, op_type, op)
        except Exception:
            continue  # moto's own validation answers for a malformed item
        before = table.get_item(hash_key, range_key) if (range_key is not None or not table.range_key_attr) else None
        saved.append((table, hash_key, range_key, copy.deepcopy(before)))
    _local.in_transaction = True
    try:
        return _transact_write_items(self, transact_items)
    except Exception:
        for table, hash_key, range_key, before in reversed(saved):
            if range_key is not None:
                partition = table.items[hash_key]
                partition.pop(range_key, None)
                if before is not None:
                    partition[range_key] = before
            else:
                table.items.pop(hash_key, None)
                if before is not None:
                    table.items[hash_key] = before
        raise
    finally:
        _local.in_transaction = False


DynamoDBBackend.transact_write_items = transact_write_items

# ---------------------------------------------------------------------------------------------
# Queries: the partition's candidate items only
# ---------------------------------------------------------------------------------------------

_all_items = Table.all_items
_query = Table.query


def _could_match(value, comparison, objs):
    # Strings only (every sort key of the store is one); UTF-8 byte order is code point order,
    # which is how Python compares str.
    bounds = [o.value for o in objs]
    if not isinstance(value, str) or not all(isinstance(b, str) for b in bounds):
        return True
    if comparison == "BETWEEN":
        return bounds[0] <= value <= bounds[1]
    if comparison == "BEGINS_WITH":
        return value.startswith(bounds[0])
    if comparison == "EQ":
        return value == bounds[0]
    if comparison == "GT":
        return value > bounds[0]
    if comparison == "GE":
        return value >= bounds[0]
    if comparison == "LT":
        return value < bounds[0]
    if comparison == "LE":
        return value <= bounds[0]
    return True


def all_items(self):
    narrowed = getattr(_local, "narrowed", None)
    if narrowed is not None and narrowed[0] is self:
        return narrowed[1]
    return _all_items(self)


def query(self, hash_key, range_comparison, range_objs, *args, **kwargs):
    index_name = kwargs.get("index_name", args[4] if len(args) > 4 else None)
    if index_name or not self.range_key_attr or hash_key is None or hash_key not in self.items:
        return _query(self, hash_key, range_comparison, range_objs, *args, **kwargs)
    # list() copies the partition under the GIL: the server's other threads may write to it.
    candidates = [
        item
        for range_key, item in list(self.items[hash_key].items())
        if not range_comparison or _could_match(range_key.value, range_comparison, range_objs)
    ]
    _local.narrowed = (self, candidates)
    try:
        return _query(self, hash_key, range_comparison, range_objs, *args, **kwargs)
    finally:
        _local.narrowed = None


Table.all_items = all_items
Table.query = query
