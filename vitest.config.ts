import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/helpers/global-setup.ts'],
    testTimeout: 120_000,
    hookTimeout: 300_000,
    // Integration files share the PostgreSQL hosts started by the global setup; each uses its own
    // database, so files may run in parallel. Two cores: two workers.
    maxWorkers: 2,
    fileParallelism: true,
  },
});
