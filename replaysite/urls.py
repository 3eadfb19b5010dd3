from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.templatetags.static import static
from django.urls import include, path
from django.utils.functional import lazy
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import IsAuthenticated

urlpatterns = [
    # Browsers ask for /favicon.ico whatever the pages link to; the icon is a static file.
    path(
        "favicon.ico",
        RedirectView.as_view(url=lazy(static, str)("replays/favicon.svg"), permanent=True),
    ),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Like every page: the schema needs a login or a token (tools fetch it with one), the
    # docs page sends a browser to the login page.
    path(
        "api/schema/",
        SpectacularAPIView.as_view(permission_classes=[IsAuthenticated]),
        name="api-schema",
    ),
    path(
        "api/docs/",
        login_required(
            SpectacularSwaggerView.as_view(
                url_name="api-schema", permission_classes=[IsAuthenticated]
            )
        ),
        name="api-docs",
    ),
    path("api/", include("replays.api.urls")),
    path("", include("replays.urls")),
]
