// Fastify as its guide writes it: listen({ port: 3000 }), at `localhost` by default
// (both loopbacks where /etc/hosts names both, as Debian's does).
import Fastify from 'fastify';

const fastify = Fastify({ logger: true });

fastify.get('/', async function handler(request, reply) {
  return { hello: 'world', pid: process.pid };
});

try {
  await fastify.listen({ port: 3000 });
} catch (err) {
  fastify.log.error(err);
  process.exit(1);
}
