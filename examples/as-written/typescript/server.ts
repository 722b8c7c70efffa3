// A TypeScript server as `tsx server.ts` runs it (the usual `npm start` of a TypeScript
// app today, no build step): a port fixed in the code, types and all.
import { createServer, IncomingMessage, ServerResponse } from 'node:http';

const port: number = 3000;

createServer((req: IncomingMessage, res: ServerResponse) => {
  res.writeHead(200, { 'Content-Type': 'text/plain' });
  res.end(`Hello from TypeScript (pid ${process.pid})\n`);
}).listen(port, () => console.log(`listening on port ${port}`));
