#!/usr/bin/env bash
# Make sure the pinned Claude Code CLI is installed for the end-to-end test
# (tests/e2e/test_claude_code_cli.py), in a local npm prefix inside the virtualenv:
# $VENV/claude-code/node_modules/.bin/claude. Does nothing when that version is already there.
set -euo pipefail

VERSION=2.1.332
PACKAGE=@anthropic-ai/claude-code
VENV=${VENV:-.venv}
PREFIX="$VENV/claude-code"
CLAUDE="$PREFIX/node_modules/.bin/claude"

installed() {
  [ -x "$CLAUDE" ] && [ "$("$CLAUDE" --version 2>/dev/null | cut -d' ' -f1)" = "$VERSION" ]
}

installed && exit 0

if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is needed to install the Claude Code CLI $VERSION for the end-to-end test;" >&2
  echo "       install Node.js and npm, or run the tests without it (that test then skips, or fails with CI=1)" >&2
  exit 1
fi

echo "==> installing the Claude Code CLI $VERSION for the end-to-end test"
mkdir -p "$PREFIX"
# The package ships a native binary per platform (an optional dependency); its postinstall
# copies that binary over the bin/claude.exe placeholder. It declares node >= 22 but runs no
# JavaScript once installed, so an older npm's engine warning is silenced with the rest.
npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund --no-update-notifier \
  --loglevel=error "$PACKAGE@$VERSION" >/dev/null
if ! installed; then
  # An npm that skips install scripts leaves the placeholder: run the postinstall directly.
  (cd "$PREFIX/node_modules/$PACKAGE" && node install.cjs >/dev/null)
fi
if ! installed; then
  echo "error: $CLAUDE does not report version $VERSION after installing $PACKAGE@$VERSION" >&2
  exit 1
fi
