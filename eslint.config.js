// `npm run lint` runs this and `prettier --check`. The rules are the ones that catch bugs (promises
// nobody awaits, async callbacks where a sync one is expected, any leaking into typed code, values
// printed as [object Object]); layout is prettier's job, so no style rules here.
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

const unusedVars = [
  'error',
  // `_name` marks a parameter a signature needs; `{ drop, ...rest }` is how a field is left out.
  { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none', ignoreRestSiblings: true },
];

// One project service for every file (two differing configs would share one cache). The two
// config files outside tsconfig.json get a default project; bench/tsconfig.json covers bench/.
const parserOptions = {
  projectService: { allowDefaultProject: ['vitest.unit.config.ts', 'scripts/*.ts'] },
  tsconfigRootDir: import.meta.dirname,
};

const promiseRules = {
  '@typescript-eslint/no-floating-promises': 'error',
  '@typescript-eslint/no-misused-promises': 'error',
  '@typescript-eslint/await-thenable': 'error',
};

export default tseslint.config(
  {
    ignores: [
      'dist/',
      'node_modules/',
      'test/matrix-binaries/',
      'bench/results/',
      'bench/.bundle/',
      '.shardctl/',
      '.scratch/',
    ],
  },
  js.configs.recommended,
  {
    languageOptions: { ecmaVersion: 2022, sourceType: 'module', globals: globals.node },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: { 'no-unused-vars': unusedVars },
  },
  {
    files: ['**/*.ts'],
    extends: [tseslint.configs.recommendedTypeChecked],
    languageOptions: { parserOptions },
    rules: {
      '@typescript-eslint/no-unused-vars': unusedVars,
      // An async function without await is how a callback meets a Promise-returning signature
      // (commander actions, hooks); flagging it finds no bugs.
      '@typescript-eslint/require-await': 'off',
      // Removes casts, finds no bugs, and is wrong where a cast narrows a literal (flags.mode as MoveMode).
      '@typescript-eslint/no-unnecessary-type-assertion': 'off',
    },
  },
  {
    // Query results are `any` rows by pg's design; tests read them directly and assert on them.
    files: ['test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      // node's typings declare path.join & co. as methods; tests destructure them from imports.
      '@typescript-eslint/unbound-method': 'off',
    },
  },
  {
    // The benchmarks are JavaScript typed by JSDoc (bench/tsconfig.json type-checks them; `npm run
    // typecheck` runs it): the JS rules plus the promise rules, on those types.
    files: ['bench/**/*.js'],
    plugins: { '@typescript-eslint': tseslint.plugin },
    languageOptions: { parser: tseslint.parser, parserOptions },
    rules: promiseRules,
  },
);
