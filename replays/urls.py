from django.urls import path

from replays import views

app_name = "replays"

urlpatterns = [
    path("", views.thread_list, name="thread-list"),
    path("threads/<int:pk>/", views.thread_detail, name="thread-detail"),
    path("threads/upload/", views.thread_upload, name="thread-upload"),
]
