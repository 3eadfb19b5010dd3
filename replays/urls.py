from django.urls import path

from replays import views

app_name = "replays"

urlpatterns = [
    path("", views.thread_list, name="thread-list"),
    path("threads/<int:pk>/", views.thread_detail, name="thread-detail"),
    path("threads/upload/", views.thread_upload, name="thread-upload"),
    path("plans/<int:pk>/", views.plan_detail, name="plan-detail"),
    path("plans/<int:pk>/approve/", views.plan_approve, name="plan-approve"),
    path("plans/<int:pk>/prepare-again/", views.plan_prepare_again, name="plan-prepare-again"),
    path("batches/", views.batch_list, name="batch-list"),
    path("batches/<int:pk>/", views.batch_detail, name="batch-detail"),
    path("batches/<int:pk>/cancel/", views.batch_cancel, name="batch-cancel"),
    path("runs/<int:pk>/", views.run_detail, name="run-detail"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="run-cancel"),
    path("runs/<int:pk>/log/", views.run_log, name="run-log"),
    path("runs/<int:pk>/compare/", views.run_compare, name="run-compare"),
    path("runs/<int:pk>/judge/", views.run_judge, name="run-judge"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("campaigns/", views.campaign_list, name="campaign-list"),
    path("campaigns/new/", views.campaign_new, name="campaign-new"),
    path("campaigns/new/preview/", views.campaign_preview, name="campaign-preview"),
    path("campaigns/<int:pk>/", views.campaign_detail, name="campaign-detail"),
    path("campaigns/<int:pk>/excluded/", views.campaign_excluded, name="campaign-excluded"),
    path("campaigns/<int:pk>/approve/", views.campaign_approve, name="campaign-approve"),
    path("campaigns/<int:pk>/cancel/", views.campaign_cancel, name="campaign-cancel"),
    path(
        "campaigns/<int:pk>/prepare-again/",
        views.campaign_prepare_again,
        name="campaign-prepare-again",
    ),
    path("campaigns/<int:pk>/results.csv", views.campaign_results_csv, name="campaign-results-csv"),
    path(
        "campaigns/<int:pk>/results.json",
        views.campaign_results_json,
        name="campaign-results-json",
    ),
]
