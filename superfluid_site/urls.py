from django.contrib import admin
from django.urls import path, re_path

from api import anthropic as api_anthropic
from api import edge, llama_routes, responses_tokens
from api import metrics as api_metrics
from api import views as api_views
from batches import views as batch_views
from dashboard import views as dashboard_views

# Under the API's paths every reply is JSON: a wrong method is an OpenAI-style 405 (api_route),
# an unknown route a 404, a bad Host a 400 and a crash a 500 (the handlers below).
urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/models", edge.api_route()(api_views.models)),
    path("v1/models/<path:model_id>", edge.api_route()(api_views.model_detail)),
    path("models", edge.api_route()(api_views.models)),  # llama-server's name without /v1 (POST /models: its router mode's)
    path("health", edge.api_route()(api_views.health)),
    path("v1/health", edge.api_route()(api_views.health)),  # llama-server answers both
    path("tokenize", edge.api_route(("POST",))(api_views.tokenize)),
    path("detokenize", edge.api_route(("POST",))(api_views.detokenize)),
    path("apply-template", edge.api_route(("POST",))(api_views.apply_template)),
    # llama-server's token count of a Responses API body (POST /v1/responses itself: asgi.py)
    path("v1/responses/input_tokens", edge.api_route(("POST",))(responses_tokens.input_tokens)),
    path("responses/input_tokens", edge.api_route(("POST",))(responses_tokens.input_tokens)),
    # Anthropic's token count (api/anthropic.py; its errors in Anthropic's shape)
    path("v1/messages/count_tokens", api_anthropic.anthropic_errors(edge.api_route(("POST",))(api_anthropic.count_tokens))),
    path("props", edge.api_route(("GET", "HEAD", "POST"))(llama_routes.props_route)),  # POST: llama-server's 501
    path("slots/<str:id_slot>", edge.api_route(("GET", "HEAD", "POST"))(llama_routes.slot_action)),  # POST: llama-server's 501
    # llama-server's count of a chat's prompt tokens
    path("chat/completions/input_tokens", edge.api_route(("POST",))(llama_routes.chat_input_tokens)),
    path("v1/chat/completions/input_tokens", edge.api_route(("POST",))(llama_routes.chat_input_tokens)),
    # llama-server's routes of features not served here, answered as it answers them when not enabled
    path("rerank", edge.api_route(("POST",))(llama_routes.rerank)),
    path("reranking", edge.api_route(("POST",))(llama_routes.rerank)),
    path("v1/rerank", edge.api_route(("POST",))(llama_routes.rerank)),
    path("v1/reranking", edge.api_route(("POST",))(llama_routes.rerank)),
    path("lora-adapters", edge.api_route(("GET", "HEAD", "POST"))(llama_routes.lora_adapters)),
    path("slots", edge.api_route()(api_views.slots)),
    path("metrics", edge.api_route()(api_metrics.metrics)),
    path("dashboard/", dashboard_views.dashboard, name="dashboard"),
    path("v1/internal/state", edge.api_route()(api_views.state)),
    path("v1/internal/models", edge.api_route()(api_views.admin_models)),
    re_path(
        r"^v1/internal/models/(?P<model_id>.+)/(?P<action>load|unload)$",
        edge.api_route(("POST",))(api_views.admin_models),
    ),
    # llama-swap's routes for its loaded models (api/views.py)
    path("running", edge.api_route()(api_views.llama_swap_running)),
    path("unload", edge.api_route()(api_views.llama_swap_unload)),
    path("api/models/unload", edge.api_route(("POST",))(api_views.llama_swap_api_unload)),
    path("api/models/unload/<path:model_id>", edge.api_route(("POST",))(api_views.llama_swap_api_unload)),
    # the Batch API (batches/): files for its input and output, batches
    path("v1/files", edge.api_route(("GET", "HEAD", "POST"))(batch_views.files)),
    path("v1/files/<str:pk>", edge.api_route(("GET", "HEAD", "DELETE"))(batch_views.file_detail)),
    path("v1/files/<str:pk>/content", edge.api_route()(batch_views.file_content)),
    path("v1/batches", edge.api_route(("GET", "HEAD", "POST"))(batch_views.batches)),
    path("v1/batches/<str:pk>", edge.api_route()(batch_views.batch_detail)),
    path("v1/batches/<str:pk>/cancel", edge.api_route(("POST",))(batch_views.batch_cancel)),
    re_path(r"^v1$", edge.unknown_route),  # not a 301 to /v1/ (APPEND_SLASH)
    re_path(r"^v1/(?P<rest>.*)$", edge.unknown_route),
]

handler400 = edge.bad_request
handler403 = edge.permission_denied
handler404 = edge.page_not_found
handler500 = edge.server_failure
