#!/usr/bin/env bash
# scripts/lowest-priority.sh CMD [ARGS...] — run CMD at the lowest CPU priority: CI's clang job
# (.ci/run), which is started in a session of its own (setsid) so that an early exit can end it.
#
# `nice -n 19` alone is not enough there: with the kernel's autogroup scheduling (Debian's kernels
# have it on, /proc/sys/kernel/sched_autogroup_enabled), every new session is a scheduling group of
# its own whose share of the CPU equals the foreground's, whatever its processes' nice values, so a
# "nice 19" job beside the main build took a whole core of two (a spinning loop so started: 96 % of
# a core beside two compiles; with its group's nice set to 19 as below, 3 %). Setting the group's
# own nice (/proc/self/autogroup, allowed to lower one's own priority) gives the job only what the
# foreground leaves idle. Without autogroup scheduling the file is absent and nice does it alone.
set -euo pipefail
if [[ -w /proc/self/autogroup ]]; then echo 19 > /proc/self/autogroup 2>/dev/null || true; fi
exec nice -n 19 "$@"
