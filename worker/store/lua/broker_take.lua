#!lua
--[[
Take up to ARGV[1] messages off a worker's queues and record each as unacked, in one step: what
kombu's Redis transport does with a BRPOP (one message) and then its QoS's MULTI (`QoS.append`:
ZADD unacked_index, HSET unacked), for several messages at once and with no moment at which a
message is off its list and not yet recorded. A worker killed after this script ran leaves every
message it took in kombu's unacked records, restored as kombu restores any (`restore_visible`
once the visibility timeout passed, `restore_unacked` when a channel closes).

The lists are read in the order given (kombu's BRPOP order: by priority step, then the queues in
the consumer's cycle), each from its tail (oldest first), until ARGV[1] are taken.

An entry with no delivery tag and delivery_info (not JSON, or not kombu's envelope) cannot be
recorded as kombu records: it is taken and returned unrecorded, for the worker to dead-letter
(worker/broker/transport.py), as it would after a BRPOP. A list the server refuses to pop (WRONGTYPE) ends the
take: what was taken before it is returned, with the error, and the worker leaves its queue out.

KEYS
  1 unacked hash          unacked         delivery tag -> JSON [envelope, exchange, routing key]
  2 unacked index zset    unacked_index   delivery tag -> when taken (the worker's clock, s)
  3.. the queue lists     <queue>, <queue>\x06\x163, ...
The broker's one script, and not the store's: it runs on the broker's server (kombu's Redis
transport has no cluster), so its keys are kombu's, in no one slot.

ARGV
  1 most to take (>= 1)
  2 now: the worker's clock in seconds, as kombu's QoS.append scores it
Returns
  {error, list, taken...}: error is "" or the server's error for list (a KEYS index from 3,
  0 when none); then per message taken three values: its list's KEYS index, the entry as it
  was on the list, and the delivery tag it is recorded unacked under ("" if not recorded)

Nothing is taken unless it can be recorded: the shebang line has the server refuse the whole
script when it is out of memory (a script without one would be refused at its first ZADD, the
messages already popped), and the unacked keys are checked to be of their types first.
]]
local hash, index = redis.call('TYPE', KEYS[1]).ok, redis.call('TYPE', KEYS[2]).ok
if (hash ~= 'hash' and hash ~= 'none') or (index ~= 'zset' and index ~= 'none') then
  return {'WRONGTYPE unacked records: ' .. KEYS[1] .. ' is ' .. hash .. ', ' .. KEYS[2]
    .. ' is ' .. index, 1}
end
local most = tonumber(ARGV[1])
local out = {'', 0}
for i = 3, #KEYS do
  if most <= 0 then
    break
  end
  local taken = redis.pcall('RPOP', KEYS[i], most)
  if type(taken) == 'table' and taken.err then
    out[1] = taken.err
    out[2] = i
    break
  end
  if taken then
    for _, entry in ipairs(taken) do
      local recorded = ''
      local ok, payload = pcall(cjson.decode, entry)
      local props = ok and type(payload) == 'table' and payload.properties
      if type(props) == 'table' then
        local tag, info = props.delivery_tag, props.delivery_info
        if type(tag) == 'string' and tag ~= '' and type(info) == 'table'
            and type(info.exchange) == 'string' and type(info.routing_key) == 'string' then
          redis.call('ZADD', KEYS[2], ARGV[2], tag)
          redis.call('HSET', KEYS[1], tag, '[' .. entry .. ',' .. cjson.encode(info.exchange)
            .. ',' .. cjson.encode(info.routing_key) .. ']')
          recorded = tag
        end
      end
      out[#out + 1] = i
      out[#out + 1] = entry
      out[#out + 1] = recorded
      most = most - 1
    end
  end
end
return out
