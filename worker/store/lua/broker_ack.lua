--[[
Forget an acknowledged (or rejected, not requeued) message's unacked record: what kombu's Redis
transport does in a MULTI (`QoS._remove_from_indices`: ZREM unacked_index, HDEL unacked), as
one command the worker's ack sends and the server runs whole. A broker script like
broker_take.lua (kombu's keys, in no one slot); it needs nothing of Redis 7, so any server
kombu supports runs it.

KEYS
  1 unacked index zset    unacked_index
  2 unacked hash          unacked
ARGV
  1 the delivery tag
Returns the number of records removed from the hash (0: already gone, restored or acked).
]]
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('HDEL', KEYS[2], ARGV[1])
