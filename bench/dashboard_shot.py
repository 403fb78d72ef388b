"""Retake docs/dashboard.png during the documented agents-and-chat scenario (bench/scenarios.py:
eight ~1,000-token background agents, a short interactive chat 2 s later), on the real server
and model, through Debian's chromium (playwright), logged in as an admin.

The picture is taken ``--at`` seconds after the agents start (default 4.5: the chat, sent at 2 s,
has answered and streams in the lane it took from an agent, which waits in the queue; the other
agents prefill and decode in the rest of the eight lanes). Prints what the page
showed. Needs a quiet machine, as every figure here: a starved machine draws a starved dashboard.

    python bench/dashboard_shot.py [--at 4.5] [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scenarios import Stream, Target, Tokens, agents_chat_jobs, run_concurrently, warm_up  # noqa: E402
from scheduler.engines.models import default_model_path, model_name_for  # noqa: E402
from testkit.harness import CHROMIUM, CHROMIUM_ARGS, ROOT, RunningServer, admin_page, create_superuser  # noqa: E402

USER, PASSWORD = "ops", "dashboard-shot-pw"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--at", type=float, default=4.5, help="seconds after the agents start (default %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = ap.parse_args()
    if CHROMIUM is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    model_path = default_model_path()
    server = RunningServer("--max-batch", "8").start()
    try:
        create_superuser(server, USER, PASSWORD)
        target = Target("superfluid", server.base, model_name_for(model_path), True, server.proc.pid if server.proc else None)
        warm_up(target)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = admin_page(browser, server.base, USER, PASSWORD)
                page.wait_for_selector("#conn[data-status=live]", timeout=30000)
                page.wait_for_selector("[data-lane='7']", timeout=30000)
                jobs = agents_chat_jobs(target, True, 1, Tokens(model_path), "dashboard")
                results: list[Stream] = []
                load = threading.Thread(target=lambda: results.extend(run_concurrently(jobs)[1]), daemon=True)
                started = time.perf_counter()
                load.start()
                page.wait_for_timeout(max(0.0, args.at - (time.perf_counter() - started)) * 1000)
                shot = Path(os.environ.get("TMPDIR", "/tmp")) / "dashboard-shot.png"
                page.screenshot(path=str(shot), full_page=True)
                busy = page.locator("[data-lane]:not([data-state=idle])").count()
                print(f"at +{time.perf_counter() - started:.1f} s: {busy} of 8 lanes busy; load {os.getloadavg()[0]:.1f}")
                load.join(900)
            finally:
                browser.close()
        failed = [f"{s.label}: {s.status} {s.error}" for s in results if not s.ok]
        chat = next((s for s in results if s.label == "chat"), None)
        print(f"scenario: {len(results)} requests, {len(failed)} failed {failed}; chat TTFT {chat.ttft if chat else None}")
        if failed or not results:
            return 1
        shutil.copy(shot, args.out)
        print(f"wrote {args.out}")
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
