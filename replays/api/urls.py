from django.urls import path, re_path

from replays.api import campaigns, errors, views

urlpatterns = [
    path("threads/", views.ThreadListView.as_view(), name="api-thread-list"),
    path("threads/import", views.ThreadImportView.as_view(), name="api-thread-import"),
    path("threads/<int:pk>/", views.ThreadDetailView.as_view(), name="api-thread-detail"),
    path("plans/", views.PlanCreateView.as_view(), name="api-plan-create"),
    path("plans/<int:pk>/", views.PlanDetailView.as_view(), name="api-plan-detail"),
    path("plans/<int:pk>/approve", views.PlanApproveView.as_view(), name="api-plan-approve"),
    path("batches/<int:pk>/", views.BatchDetailView.as_view(), name="api-batch-detail"),
    path("batches/<int:pk>/cancel", views.BatchCancelView.as_view(), name="api-batch-cancel"),
    path("runs/<int:pk>/", views.RunDetailView.as_view(), name="api-run-detail"),
    path("runs/<int:pk>/cancel", views.RunCancelView.as_view(), name="api-run-cancel"),
    path("runs/<int:pk>/diff", views.RunDiffView.as_view(), name="api-run-diff"),
    path("runs/<int:pk>/log", views.RunLogView.as_view(), name="api-run-log"),
    path("runs/<int:pk>/report", views.RunReportView.as_view(), name="api-run-report"),
    path("runs/<int:pk>/judge", views.RunJudgeView.as_view(), name="api-run-judge"),
    path("models/", views.ModelListView.as_view(), name="api-models"),
    path("evaluators/", views.EvaluatorListView.as_view(), name="api-evaluators"),
    path("batches/<int:pk>/results", views.BatchResultsView.as_view(), name="api-batch-results"),
    path("campaigns/", campaigns.CampaignListView.as_view(), name="api-campaign-list"),
    path("campaigns/<int:pk>/", campaigns.CampaignDetailView.as_view(), name="api-campaign-detail"),
    path(
        "campaigns/<int:pk>/approve",
        campaigns.CampaignApproveView.as_view(),
        name="api-campaign-approve",
    ),
    path(
        "campaigns/<int:pk>/results",
        campaigns.CampaignResultsView.as_view(),
        name="api-campaign-results",
    ),
    path(
        "campaigns/<int:pk>/cancel",
        campaigns.CampaignCancelView.as_view(),
        name="api-campaign-cancel",
    ),
    path("leaderboard/", views.LeaderboardView.as_view(), name="api-leaderboard"),
    path(
        "leaderboard/filters",
        views.LeaderboardFiltersView.as_view(),
        name="api-leaderboard-filters",
    ),
    # Last: any other path under /api/ is a 404 in the error shape (a newline too).
    re_path(r"^(?P<path>[\s\S]*)\Z", errors.unknown_path, name="api-unknown-path"),
]
