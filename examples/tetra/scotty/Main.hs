-- The fifth post's tetration app on Scotty (see ../README.md):
--
--   GET /          "OK, no problema!"
--   GET /tetra/:x  x**x as a decimal integer (Haskell's Integer is exact); x: 1 to 4
--                  ASCII digits, at most 1000, else 400 "x must be an integer in 0..1000"
--   GET /health    200 "ok"
--
-- Reads PORT (default 3000) and binds 127.0.0.1:PORT, or serves the socket drover's
-- shared mode passes as fd 3 (LISTEN_FDS; LISTEN_PID, when set, must be this pid).
-- Scotty's own `scotty` can only bind a port, so the app is built with `scottyApp`
-- and run by warp on a socket of our choosing.
-- Every response carries `x-worker`: DROVER_WORKER_ID, or the pid without it.
-- On SIGTERM or SIGINT it stops accepting, finishes requests in flight (waiting at
-- most 5 s for open keep-alive connections) and exits 0.
--
-- Build: ghc -O -threaded -outputdir DIR -o tetra-scotty Main.hs
{-# LANGUAGE OverloadedStrings #-}
module Main (main) where

import Control.Monad (void, when)
import Data.Char (isDigit)
import qualified Data.ByteString.Char8 as B
import qualified Data.Text.Lazy as TL
import Network.HTTP.Types (status400)
import Network.Socket
import Network.Wai (mapResponseHeaders)
import Network.Wai.Handler.Warp
import System.Environment (lookupEnv)
import System.IO
import System.Posix.IO (setFdOption, FdOption (NonBlockingRead))
import System.Posix.Process (getProcessID)
import System.Posix.Signals (installHandler, sigINT, sigTERM, Handler (Catch))
import System.Posix.Types (Fd (..))
import Web.Scotty

-- 1000^1000 has 3001 digits: bounded work and a bounded answer per request.
maxX :: Integer
maxX = 1000

app :: String -> ScottyM ()
app worker = do
  -- Around every route, so Scotty's own 404s carry it too.
  middleware $ \inner req respond ->
    inner req (respond . mapResponseHeaders (("x-worker", B.pack worker) :))
  get "/" $ text "OK, no problema!"
  get "/health" $ text "ok"
  get "/tetra/:x" $ do
    -- Taken as a string: a typed `param` that fails to parse falls through to a 404.
    raw <- param "x"
    -- /tetra/ is not found in the other four frameworks either.
    when (null raw) next
    -- The same grammar in all five apps: `read` would take " 7" or "0x10".
    if length raw <= 4 && all isDigit raw && read raw <= maxX
      then let x = read raw :: Integer in text (TL.pack (show (x ^ x)))
      else do
        status status400
        text (TL.pack ("x must be an integer in 0.." ++ show maxX))

-- fd 3 if drover passed a socket meant for this process. A LISTEN_PID of another
-- process means the variables leaked through a wrapper (a shell script).
inheritedSocket :: IO (Maybe Socket)
inheritedSocket = do
  fds <- lookupEnv "LISTEN_FDS"
  listenPid <- lookupEnv "LISTEN_PID"
  pid <- show <$> getProcessID
  case fds of
    Just n | not (null n), all isDigit n, read n >= (1 :: Integer), maybe True (== pid) listenPid -> do
      -- GHC's I/O manager waits for readiness and then accepts; on a blocking socket
      -- the worker that loses the race for a connection would block inside accept().
      setFdOption (Fd 3) NonBlockingRead True
      Just <$> mkSocket 3
    _ -> pure Nothing

bindPort :: Int -> IO Socket
bindPort port = do
  let hints = defaultHints {addrSocketType = Stream, addrFlags = [AI_NUMERICHOST, AI_NUMERICSERV]}
  addr : _ <- getAddrInfo (Just hints) (Just "127.0.0.1") (Just (show port))
  sock <- socket (addrFamily addr) Stream defaultProtocol
  setSocketOption sock ReuseAddr 1
  bind sock (addrAddress addr)
  listen sock 1024
  pure sock

main :: IO ()
main = do
  hSetBuffering stdout LineBuffering
  pid <- show <$> getProcessID
  worker <- maybe pid id <$> lookupEnv "DROVER_WORKER_ID"
  port <- maybe 3000 read <$> lookupEnv "PORT"
  inherited <- inheritedSocket
  sock <- maybe (bindPort port) pure inherited
  addr <- getSocketName sock
  let how = maybe "" (const " (fd 3 from LISTEN_FDS)") inherited
  putStrLn ("tetra (scotty) worker " ++ worker ++ " (pid " ++ pid ++ ") listening on " ++ show addr ++ how)
  waiApp <- scottyApp (app worker)
  let onSignal closeListener =
        mapM_ (\s -> void (installHandler s (Catch closeListener) Nothing)) [sigTERM, sigINT]
      settings =
        setInstallShutdownHandler onSignal
          -- Idle keep-alive connections would otherwise hold the exit until they time out.
          $ setGracefulShutdownTimeout (Just 5) defaultSettings
  -- Returns once the listener is closed and the connections are done.
  runSettingsSocket settings sock waiApp
