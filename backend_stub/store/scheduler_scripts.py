"""The Redis store's queue: its keys and the Lua scripts that change them, each in one atomic step.

The rules are backend_stub.store.fair's; these scripts are their Redis form (the SQLite store
has the same rules in Python, and the store contract tests hold both to them). Times are
Redis's own clock (TIME), so backends with skewed clocks agree on when a lease ran out.
An entry is "<seq>|<task id>": a task queued again gets a new entry, and the ack of an old
lease can never remove it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueKeys:
    """All under the store's `{prefix}` hash tag: one Redis Cluster slot (see redis_store)."""

    prefix: str

    @property
    def tenant_prefix(self) -> str:
        return f"{self.prefix}:q:"  # + tenant: that tenant's list of entries, oldest first

    @property
    def ready(self) -> str:
        return f"{self.prefix}:ready"  # sorted set: tenants with queued entries, by pass

    @property
    def passes(self) -> str:
        return f"{self.prefix}:passes"  # hash: tenant -> pass, kept while its queue is empty

    @property
    def vtime(self) -> str:
        return f"{self.prefix}:vtime"  # the pass of the tenant served last

    @property
    def seq(self) -> str:
        return f"{self.prefix}:seq"  # entry numbers

    @property
    def leases(self) -> str:
        return f"{self.prefix}:leases"  # sorted set: leased entry -> deadline (ms, Redis clock)

    @property
    def leased(self) -> str:
        return f"{self.prefix}:leased"  # hash: leased entry -> JSON [tenant, holder]

    @property
    def running(self) -> str:
        return f"{self.prefix}:running"  # hash: tenant -> leases it holds

    @property
    def wake(self) -> str:
        return f"{self.prefix}:wake"  # list of tokens idle workers wait on (BLPOP), at most 64


NOW_MS = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

_WAKE = """
redis.call('LPUSH', KEYS[wake], '1')
redis.call('LTRIM', KEYS[wake], 0, 63)
"""

# KEYS: ready, passes, vtime, seq, wake; ARGV: tenant key prefix, tenant, task id
ENQUEUE = """
local tenant = ARGV[2]
local entry = redis.call('INCR', KEYS[4]) .. '|' .. ARGV[3]
redis.call('RPUSH', ARGV[1] .. tenant, entry)
if not redis.call('ZSCORE', KEYS[1], tenant) then
  local pass = tonumber(redis.call('HGET', KEYS[2], tenant) or '0')
  local vtime = tonumber(redis.call('GET', KEYS[3]) or '0')
  redis.call('ZADD', KEYS[1], string.format('%.0f', math.max(pass, vtime)), tenant)
end
""" + _WAKE.replace("KEYS[wake]", "KEYS[5]")

# KEYS: ready, passes, vtime, leases, leased, running
# ARGV: tenant key prefix, consumer, lease ms, default stride, default cap (0: none),
#       then tenant, stride, cap for each tenant with its own settings
CLAIM = NOW_MS + """
local consumer, deadline = ARGV[2], now + tonumber(ARGV[3])
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 1)
if #expired > 0 then
  local entry = expired[1]
  local holder = cjson.decode(redis.call('HGET', KEYS[5], entry))
  redis.call('HSET', KEYS[5], entry, cjson.encode({holder[1], consumer}))
  redis.call('ZADD', KEYS[4], deadline, entry)
  return entry
end
-- passes are whole numbers written out in full ("%.14g" would round them once they grow long)
local function whole(n) return string.format('%.0f', n) end
local strides, caps = {}, {}
for i = 6, #ARGV, 3 do
  strides[ARGV[i]] = tonumber(ARGV[i + 1])
  caps[ARGV[i]] = tonumber(ARGV[i + 2])
end
local vtime = tonumber(redis.call('GET', KEYS[3]) or '0')
-- tenants in turn order; those at their cap are skipped (bounded: a claim looks at 1,000 at most)
for start = 0, 999, 100 do
  local batch = redis.call('ZRANGE', KEYS[1], start, start + 99, 'WITHSCORES')
  if #batch == 0 then return false end
  for j = 1, #batch, 2 do
    local tenant = batch[j]
    local cap = caps[tenant] or tonumber(ARGV[5])
    if cap == 0 or tonumber(redis.call('HGET', KEYS[6], tenant) or '0') < cap then
      local queue = ARGV[1] .. tenant
      local entry = redis.call('LPOP', queue)
      local pass = math.max(tonumber(batch[j + 1]), vtime)
      local after = pass + (strides[tenant] or tonumber(ARGV[4]))
      if redis.call('LLEN', queue) > 0 then
        redis.call('ZADD', KEYS[1], whole(after), tenant)
      else
        redis.call('ZREM', KEYS[1], tenant)
        redis.call('HSET', KEYS[2], tenant, whole(after))
      end
      if entry then
        redis.call('SET', KEYS[3], whole(pass))
        redis.call('HINCRBY', KEYS[6], tenant, 1)
        redis.call('ZADD', KEYS[4], deadline, entry)
        redis.call('HSET', KEYS[5], entry, cjson.encode({tenant, consumer}))
        return entry
      end
    end
  end
end
return false
"""

# KEYS: leases, leased; ARGV: entry, consumer, lease ms
RENEW = NOW_MS + """
local holder = redis.call('HGET', KEYS[2], ARGV[1])
if not holder or cjson.decode(holder)[2] ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

# KEYS: leases, leased, running, wake; ARGV: entry, its holder
ACK = """
local holder = redis.call('HGET', KEYS[2], ARGV[1])
if not holder then return 0 end
local tenant_holder = cjson.decode(holder)
if tenant_holder[2] ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('HINCRBY', KEYS[3], tenant_holder[1], -1) <= 0 then
  redis.call('HDEL', KEYS[3], tenant_holder[1])
end
""" + _WAKE.replace("KEYS[wake]", "KEYS[4]") + """
return 1
"""
