from django.urls import path

from replays.api import views

urlpatterns = [
    path("threads/", views.ThreadListView.as_view(), name="api-thread-list"),
    path("threads/import", views.ThreadImportView.as_view(), name="api-thread-import"),
    path("threads/<int:pk>/", views.ThreadDetailView.as_view(), name="api-thread-detail"),
]
