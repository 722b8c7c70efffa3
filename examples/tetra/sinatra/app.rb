#!/usr/bin/env ruby
# frozen_string_literal: true

# The fifth post's tetration app on Sinatra (see ../README.md):
#
#   GET /          "OK, no problema!"
#   GET /tetra/:x  x**x as a decimal integer (Ruby integers are exact); x: 1 to 4 ASCII
#                  digits, at most 1000, else 400 "x must be an integer in 0..1000"
#   GET /health    200 "ok"
#
# Reads PORT (default 3000) and binds 127.0.0.1:PORT, or serves the socket drover's
# shared mode passes as fd 3 (LISTEN_FDS; LISTEN_PID, when set, must be this pid).
# Served by WEBrick through Rack, driven here rather than by Sinatra's `run!`, which
# can only bind a port: WEBrick can be told not to listen and be handed fd 3 instead.
# Every response carries `x-worker`: DROVER_WORKER_ID, or the pid without it.
# On SIGTERM or SIGINT it stops accepting, finishes the requests in hand and exits 0.

require 'sinatra/base'
require 'rack/handler/webrick'
require 'socket'

PORT = Integer(ENV.fetch('PORT', '3000'), 10)
WORKER = ENV['DROVER_WORKER_ID'] || Process.pid.to_s
# 1000**1000 has 3001 digits: bounded work and a bounded answer per request.
MAX_X = 1000

class Tetra < Sinatra::Base
  # Plain text, and no HTML error pages with backtraces.
  set :default_content_type, 'text/plain'
  set :show_exceptions, false

  # Filters run for unmatched routes too, so 404s carry the header.
  before { headers 'x-worker' => WORKER }

  get('/') { 'OK, no problema!' }
  get('/health') { 'ok' }

  get '/tetra/:x' do
    raw = params['x']
    # The same grammar in all five apps: Integer() alone would take "0x10" or "1_0".
    halt 400, "x must be an integer in 0..#{MAX_X}" unless raw.match?(/\A[0-9]{1,4}\z/) && raw.to_i <= MAX_X
    x = raw.to_i
    (x**x).to_s
  end
end

# fd 3 if drover passed a socket meant for this process. A LISTEN_PID of another
# process means the variables leaked through a wrapper (a shell script).
def inherited_socket
  fds = ENV.fetch('LISTEN_FDS', '')
  return nil unless fds.match?(/\A[0-9]+\z/) && fds.to_i >= 1

  pid = ENV['LISTEN_PID']
  return nil if pid && pid != Process.pid.to_s

  TCPServer.for_fd(3)
end

socket = inherited_socket
options = {
  Host: '127.0.0.1', Port: PORT,
  # WEBrick accepts with accept_nonblock, so workers sharing fd 3 and losing the race
  # for a connection just wait for the next one.
  DoNotListen: !socket.nil?,
  # drover logs requests; WEBrick's access log and banner would only add noise.
  AccessLog: [], Logger: WEBrick::Log.new($stderr, WEBrick::Log::WARN),
  StartCallback: lambda do
    addr = $server.listeners.first.local_address
    how = socket ? ' (fd 3 from LISTEN_FDS)' : ''
    puts "tetra (sinatra) worker #{WORKER} (pid #{Process.pid}) " \
         "listening on #{addr.ip_address}:#{addr.ip_port}#{how}"
    $stdout.flush
  end
}
Rack::Handler::WEBrick.run(Tetra, **options) do |server|
  $server = server
  server.listeners << socket if socket
  # shutdown stops accepting; start then returns after the requests in hand finish.
  %w[TERM INT].each { |sig| trap(sig) { server.shutdown } }
end
