#!/usr/bin/env bash
# A new user's project, outside the workspace, built from the README's lines alone: a fresh
# cargo project whose Cargo.toml is the README's `toml` block (burn-ckpt pointed at this
# checkout, as the README says to until the crate is on crates.io) and whose program is
# `scripts/new-user/main.rs` with the README's custom-loop block pasted in. It trains 250 steps
# (checkpoints at 100, 200 and the last step), then again to 300: the second run must resume
# from step 250.
#
# Usage: scripts/new-user-project.sh [WORK_DIR]  (default: a temporary directory)
# It builds with the dev profile and the README's tip for it (dependencies optimized), in this
# checkout's target directory (CARGO_TARGET_DIR to change it): the dependencies whose features
# match the workspace's are reused, and a rerun is incremental.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
proj="$work/first-run"
rm -rf "$proj"
mkdir -p "$proj/src"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}

python3 - "$repo" "$proj" <<'PY'
import re, sys
repo, proj = sys.argv[1], sys.argv[2]
readme = open(f"{repo}/README.md").read()
def block(lang, containing):
    for body in re.findall(r"```" + lang + r"\n(.*?)```", readme, re.S):
        if containing in body:
            return body
    sys.exit(f"README.md has no ```{lang} block containing {containing!r}")
deps = block("toml", "burn-ckpt")
lines = []
for line in deps.splitlines():
    if line.startswith("burn-ckpt"):
        # What the README tells a user to write until the crate is published.
        line = f'burn-ckpt = {{ path = "{repo}" }}'
    lines.append(line)
toml = "[package]\nname = \"first-run\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n" + "\n".join(lines) + "\n"
# A project of its own, not a member of the checkout's workspace.
toml += "\n[workspace]\n"
# The README's tip for debug builds (Burn is slow unoptimized); `debug = false` as in this
# workspace, so the dependencies built for its tests are reused.
toml += '\n[profile.dev.package."*"]\nopt-level = 3\ndebug = false\n'
open(f"{proj}/Cargo.toml", "w").write(toml)
snippet = block("rust", "CheckpointManager::open")
template = open(f"{repo}/scripts/new-user/main.rs").read()
marker = "    // README_SNIPPET\n"
assert marker in template
indented = "".join("    " + l + "\n" if l else "\n" for l in snippet.splitlines())
open(f"{proj}/src/main.rs", "w").write(template.replace(marker, indented))
PY
# The same dependency versions as this checkout's tests (a fresh resolution could pick up a
# release that breaks the build on a day nothing here changed).
cp "$repo/Cargo.lock" "$proj/Cargo.lock"
cd "$proj"
echo "new-user project: $proj"
cat Cargo.toml
start=$(date +%s)
cargo build --quiet
echo "new-user project: built in $(( $(date +%s) - start )) s"
first=$(cargo run --quiet -- 250)
echo "$first"
second=$(cargo run --quiet -- 300)
echo "$second"
[[ "$first" == "trained steps 1..=250, 3 checkpoints saved" ]] || { echo "unexpected first run" >&2; exit 1; }
[[ "$second" == "trained steps 251..=300, 1 checkpoints saved" ]] || { echo "the second run did not resume from step 250" >&2; exit 1; }
# The default retention keeps the newest 3.
for s in 00000200 00000250 00000300; do
    [[ -f "runs/x/step-$s/manifest.json" ]] || { echo "no checkpoint step-$s" >&2; exit 1; }
done
[[ ! -e runs/x/step-00000100 ]] || { echo "step-00000100 outlived the default retention" >&2; exit 1; }
echo "new-user project: ok"
