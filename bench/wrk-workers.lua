-- wrk script: counts answers by their x-worker header and prints, at the end, one JSON
-- line with the request rate, p99 latency (microseconds) and the count per worker.
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  workers = {}
end

function response(status, headers, body)
  local w = headers["x-worker"] or "?"
  workers[w] = (workers[w] or 0) + 1
end

done = function(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for w, n in pairs(t:get("workers")) do
      total[w] = (total[w] or 0) + n
    end
  end
  local parts = {}
  for w, n in pairs(total) do
    table.insert(parts, string.format('"%s":%d', w, n))
  end
  local e = summary.errors
  io.write(string.format(
    '{"rps":%.1f,"p99_us":%d,"errors":%d,"workers":{%s}}\n',
    summary.requests / (summary.duration / 1e6), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout, table.concat(parts, ",")))
end
