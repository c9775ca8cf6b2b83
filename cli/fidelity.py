"""``nearshore fidelity``: check that emulated links deliver their profiles' delay and rate."""

from __future__ import annotations

import argparse
import asyncio

from netem.fidelity import fidelity_check
from netem.profiles import list_profiles, load_profile
from netem.tc import tc_netem_available


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profiles", nargs="*", metavar="PROFILE", help="names or paths (default: all)")
    parser.add_argument("--round-trips", type=int, default=30, help="ping-pongs per profile (default 30)")
    parser.add_argument("--seconds", type=float, default=2.0, help="data per rate check in s (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed for jitter and loss draws (default 0)")


def main(args: argparse.Namespace) -> int:
    profiles = [load_profile(name) for name in (args.profiles or list_profiles())]
    ok, why = tc_netem_available()
    print(f"backend: userspace link emulator ({'tc netem also available' if ok else 'tc: ' + why})")
    print(
        f"{'profile':<30} {'floor':>6} {'RTT':>7} {'model p50':>9} {'measured':>9} {'error':>6}  "
        f"{'rate a->b kbit/s':>17} {'rate b->a kbit/s':>17}  result"
    )
    failed = 0
    for profile in profiles:
        report = asyncio.run(
            fidelity_check(profile, round_trips=args.round_trips, seconds=args.seconds, seed=args.seed)
        )
        failed += not report.ok
        rates = {rate.way: f"{rate.set_kbps:g}/{rate.measured_kbps:.0f}" for rate in report.rates}
        print(
            f"{report.profile:<30} {report.floor_rtt_ms:>6.1f} {report.profile_rtt_ms:>7.2f} "
            f"{report.model_p50_ms:>9.2f} {report.measured_p50_ms:>9.2f} {report.error_ms:>+6.2f}  "
            f"{rates.get('a_to_b', '-'):>17} {rates.get('b_to_a', '-'):>17}  "
            f"{'ok' if report.ok else 'FAIL'}",
            flush=True,
        )
    print("RTT: p50 within 2 ms or 3% of the seeded model; rate (set/measured): middle 80% within 5%")
    return 1 if failed else 0
