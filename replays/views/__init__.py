"""Server-rendered pages, one module per page family: threads (list, thread, upload),
replays (plan, approval), results (batches, runs) and campaigns. Thin: reads go straight to the
models; writes go through the services the commands and the API use."""

from replays.views.campaigns import (
    campaign_approve,
    campaign_cancel,
    campaign_detail,
    campaign_excluded,
    campaign_list,
    campaign_new,
    campaign_prepare_again,
    campaign_preview,
    campaign_results_csv,
    campaign_results_json,
)
from replays.views.comparison import run_compare, run_judge
from replays.views.leaderboard import leaderboard
from replays.views.replays import plan_approve, plan_detail, plan_prepare_again
from replays.views.results import (
    batch_cancel,
    batch_detail,
    batch_list,
    run_cancel,
    run_detail,
    run_log,
)
from replays.views.threads import thread_detail, thread_list, thread_upload

__all__ = [
    "batch_cancel",
    "batch_detail",
    "batch_list",
    "plan_approve",
    "plan_detail",
    "plan_prepare_again",
    "run_cancel",
    "run_detail",
    "run_log",
    "thread_detail",
    "thread_list",
    "thread_upload",
    "run_compare",
    "run_judge",
    "leaderboard",
    "campaign_approve",
    "campaign_cancel",
    "campaign_detail",
    "campaign_excluded",
    "campaign_list",
    "campaign_new",
    "campaign_prepare_again",
    "campaign_preview",
    "campaign_results_csv",
    "campaign_results_json",
]
