export default { test: { include: ['test/unit/**/*.test.ts'] } };
