"""What every server check script shares: its command line (`--base-url`, `--model`,
`--openai-version` and the script's own options), the check that the imported `openai`
package is the pinned release, the client, and the exit statuses (0 all checks passed, 1 a
check failed, 3 the `openai` package is missing or another release)."""

import argparse
import sys

try:
    import openai
except ImportError:
    print("the `openai` Python package is missing (the Rust test installs the pinned release;"
          " by hand: pip install openai)", file=sys.stderr)
    sys.exit(3)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def connect(add_options=None, timeout=120):
    """Parses the command line (`add_options(parser)` adds the script's own) and returns the
    options and an `openai.OpenAI` client for the server (`--api-key`, if the script added
    one, else "none")."""
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--openai-version", help="the `openai` release required")
    if add_options:
        add_options(p)
    a = p.parse_args()
    if a.openai_version and openai.__version__ != a.openai_version:
        print(f"openai {openai.__version__} was imported (from {openai.__file__}),"
              f" but the checks need {a.openai_version}", file=sys.stderr)
        sys.exit(3)
    key = getattr(a, "api_key", "none")
    client = openai.OpenAI(base_url=a.base_url, api_key=key, max_retries=0, timeout=timeout)
    return a, client


def run(main):
    """Runs `main`, turning a failed check (an `AssertionError`) into exit status 1."""
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
