"""Rows made directly, as approval and the judges leave them, for the benchmarks (bench/)
and the tests: a repository with a baseline and an ending, a batch of queued runs, a
leaderboard's worth of judged runs. Nothing in the application imports them."""
