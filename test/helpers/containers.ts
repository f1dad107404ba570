/**
 * A PostgreSQL container for the tests (the global setup's hosts, a test's own host): the
 * testcontainers module's container, waited for by its log and its port rather than by a health
 * check. The module's own health check runs `pg_isready` in the container every 250 ms for the
 * container's whole life: a process started through the runtime and a server connection each
 * time, four times a second per container, which took a fifth of both cores for the length of a
 * run. The entrypoint sends its setup server's log nowhere, so the one "ready to accept
 * connections" is the server the tests use.
 */
import type { PostgreSqlContainer } from '@testcontainers/postgresql';

export async function postgresContainer(image: string): Promise<PostgreSqlContainer> {
  const { Wait } = await import('testcontainers');
  const { PostgreSqlContainer } = await import('@testcontainers/postgresql');
  return (
    new PostgreSqlContainer(image)
      // A health check the module does not replace with its own, and that never runs in a test's time.
      .withHealthCheck({ test: ['CMD', 'true'], interval: 3_600_000, timeout: 1_000, retries: 1 })
      .withWaitStrategy(
        Wait.forAll([Wait.forLogMessage(/database system is ready to accept connections/), Wait.forListeningPorts()]),
      )
  );
}
