"""The Redis store's task-record scripts: the write that appends to the change log, the log's reads and
trims, and callback delivery claims, each one atomic step.

The change log is a stream (`<prefix>:changes`). A record and its stream entry are written by one
script, so a reader never sees one without the other, and Redis runs one script at a time, so the
entry ids (Redis's own "<ms>-<seq>", from its clock) increase in the order readers see them. The ids
handed out are those, zero-padded to a fixed width ("<15 digits>-<10 digits>"), so that they compare
as strings in log order. Trimming (XTRIM MINID) notes the newest id it removed
(`<prefix>:changes:trimmed`): a reader after an older id has lost entries.

A delivery claim is one string per task (`<prefix>:callback_claim:<task id>`), "<until ms>|<seq>|<holder>"
on Redis's clock, so backends with skewed clocks agree on when a claim ran out. It is deleted when its
holder records the outcome; one left by a holder that died is overwritten by the next claim.
"""
from __future__ import annotations

import re

from backend_stub.store.scheduler_scripts import NOW_MS

CHANGE_ID = re.compile(r"([0-9]{15})-([0-9]{10})")


def change_id(stream_id: str) -> str:
    """The change id of a stream entry id, as RECORD makes it."""
    ms, _, seq = stream_id.partition("-")
    return f"{int(ms):015d}-{int(seq):010d}"


def stream_id(change_id: str) -> str:
    """Raises ValueError on anything that is not a change id of this store."""
    match = CHANGE_ID.fullmatch(change_id)
    if match is None:
        raise ValueError("not a change id of this store")
    return f"{int(match[1])}-{int(match[2])}"


# KEYS: task record, changes stream; ARGV: the record's JSON before and after its change id, task id,
# tenant, the task as the status endpoint answers it. Returns the change id.
RECORD = """
local id = redis.call('XADD', KEYS[2], '*', 'task_id', ARGV[3], 'tenant', ARGV[4], 'task', ARGV[5])
local ms, seq = string.match(id, '^(%d+)-(%d+)$')
local change_id = string.rep('0', 15 - #ms) .. ms .. '-' .. string.rep('0', 10 - #seq) .. seq
redis.call('SET', KEYS[1], ARGV[1] .. change_id .. ARGV[2])
return change_id
"""

_LAST_ID = """
local function last_id(stream)
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return info[i + 1] end
  end
end
"""

# KEYS: changes stream. Returns the newest id issued, or nil before the first.
LATEST = _LAST_ID + """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return last_id(KEYS[1])
"""

# KEYS: changes stream, trimmed; ARGV: after (a stream id, '' for the oldest entry kept), count.
# Returns the entries, or nil when entries after `after` are gone (trimmed, or a log that lost its data).
READ = _LAST_ID + """
local function older(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
local after = ARGV[1]
if after == '' then
  return redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[2])
end
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if older(after, redis.call('GET', KEYS[2]) or '0-0') or older(last_id(KEYS[1]), after) then return false end
return redis.call('XRANGE', KEYS[1], '(' .. after, '+', 'COUNT', ARGV[2])
"""

# KEYS: changes stream, trimmed; ARGV: retention ms. Returns how many entries were removed.
TRIM = NOW_MS + """
local cutoff = string.format('%.0f', now - tonumber(ARGV[1])) .. '-0'
local newest = redis.call('XREVRANGE', KEYS[1], '(' .. cutoff, '-', 'COUNT', 1)
if #newest == 0 then return 0 end
local removed = redis.call('XTRIM', KEYS[1], 'MINID', cutoff)
redis.call('SET', KEYS[2], newest[1][1])
return removed
"""

# KEYS: definitions (sorted set: digest -> when last recorded, backend clock), the definition's key
# ARGV: digest, recorded before (backend clock). Removes it if it was not recorded since; 1 if removed.
DROP_DEFINITION = """
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and tonumber(at) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('DEL', KEYS[2])
"""

# KEYS: claim, task record, callbacks (sorted set: task id -> when due, backend clock)
# ARGV: task id, holder, lease ms, now (backend clock, as `due_callbacks` is asked), due again at (backend clock)
# Returns nil, or {the record as claimed, 1 if a dead holder's claim was taken over else 0}.
CLAIM_CALLBACK = NOW_MS + """
local raw = redis.call('GET', KEYS[2])
if not raw then return false end
local cb = cjson.decode(raw)['callback']
if type(cb) ~= 'table' or cb['state'] ~= 'PENDING' or type(cb['seq']) ~= 'number' then return false end
local seq = string.format('%d', cb['seq'])
local held = redis.call('GET', KEYS[1])
local taken_over = 0
if held then
  local until_ms, held_seq, holder = string.match(held, '^(%d+)|(%d+)|(.*)$')
  if tonumber(until_ms) > now then
    if held_seq == seq and holder == ARGV[2] then return {raw, 0} end
    return false
  end
  taken_over = 1
end
local due = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[4]) then return false end
redis.call('SET', KEYS[1], string.format('%.0f', now + tonumber(ARGV[3])) .. '|' .. seq .. '|' .. ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
return {raw, taken_over}
"""


def claim_value_holds(value: str | None, seq: int, holder: str) -> bool:
    """Whether a claim key's value is the claim of `holder` on notification `seq` (live or run out)."""
    if value is None:
        return False
    _, held_seq, held_by = value.split("|", 2)
    return int(held_seq) == seq and held_by == holder
