from django.contrib import admin
from django.urls import path, re_path

from api import metrics as api_metrics
from api import views as api_views
from dashboard import views as dashboard_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/models", api_views.models),
    path("v1/models/<path:model_id>", api_views.model_detail),
    path("health", api_views.health),
    path("tokenize", api_views.tokenize),
    path("detokenize", api_views.detokenize),
    path("props", api_views.props),
    path("slots", api_views.slots),
    path("metrics", api_metrics.metrics),
    path("dashboard/", dashboard_views.dashboard, name="dashboard"),
    path("v1/internal/state", api_views.state),
    re_path(r"^v1/(?P<rest>.*)$", api_views.unknown_route),
]
