-- wrk script for bench/shared.sh's mixed scenarios: 90 % cheap requests (1e4 points,
-- ~0.2 ms), 10 % dear ones (5e5 points, ~10 ms), each on a new connection
-- (`Connection: close`), so every request is a placement. Prints the summary as JSON.
math.randomseed(os.time())
request = function()
  local path = (math.random() < 0.1) and "/pi?iterations=500000" or "/pi?iterations=10000"
  return wrk.format("GET", path, { ["Connection"] = "close" })
end
dofile(os.getenv("WRK_JSON"))
