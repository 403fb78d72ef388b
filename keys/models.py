"""API keys, the policies they follow, and class-lane caps: edited in the admin.

Change them through ``keys/actions.py`` (the admin and the commands do): each mutation bumps
``ConfigVersion`` in the same transaction, which is how every web process notices within a
second, and pushes the class-lane caps to the engine worker after commit.
"""

from __future__ import annotations

from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from scheduler.core.qos import BAND_SPACING, QosClass
from superfluid_site.serving import serving

from .snapshot import RESERVED_KEY_NAMES, STATIC_KEY_NAME

# A policy's tier offset is added to X-LlamaSwap-Priority. Bands sit BAND_SPACING (100) apart, so
# a priority at a band's anchor stays in its band while |offset| + SWAP_AFFINITY_BONUS is below
# half the spacing: |offset| <= 39 with the seed's default swap affinity bonus of 10.
SWAP_AFFINITY_BONUS = 10
MAX_PRIORITY_OFFSET = BAND_SPACING // 2 - SWAP_AFFINITY_BONUS - 1
# The most a policy's requests per minute or max concurrent may be: PostgreSQL's integer, which
# Django's own check enforces there while SQLite took up to 2**63 - 1 (a database moved later
# then refused the row). Far beyond any real limit: a bigger number is a typo, not a limit.
MAX_LIMIT = 2**31 - 1

QOS_CHOICES = [(int(c), c.label) for c in QosClass]


class KeyPolicy(models.Model):
    name = models.CharField(max_length=100, unique=True)
    default_class = models.PositiveSmallIntegerField(
        choices=QOS_CHOICES, default=int(QosClass.AGENT), help_text="Class of requests that name none."
    )
    max_class = models.PositiveSmallIntegerField(
        "best class",
        choices=QOS_CHOICES,
        default=int(QosClass.AGENT),
        help_text="The most urgent class x-superfluid-qos may ask for; asking above it is 403. "
        "At least as good as the default class.",
    )
    allow_batch_invariant = models.BooleanField(
        "may ask batch-invariant", default=False, help_text="May send x-superfluid-batch-invariant: true."
    )
    rate_limit_rpm = models.PositiveIntegerField(
        "requests per minute", default=0, help_text="Token bucket per key (capacity = this). 0 = unlimited."
    )
    max_concurrent = models.PositiveIntegerField(
        default=0, help_text="Requests in flight at once (a stream holds its slot to the end). 0 = unlimited."
    )
    priority_offset = models.SmallIntegerField(
        default=0,
        help_text=f"Tier offset added to X-LlamaSwap-Priority, -{MAX_PRIORITY_OFFSET}..{MAX_PRIORITY_OFFSET}: "
        "orders work inside a band, never crosses one.",
    )
    allowed_models = models.TextField(
        blank=True, help_text="Model ids this policy may use, comma or newline separated. Empty = all."
    )
    share_prefix_cache = models.BooleanField(
        "shares the prefix cache",
        default=False,
        help_text="Share cached prompt prefixes with keyless requests and other sharing policies. Off: this "
        "policy's keys have a prefix cache of their own, so no other tenant can tell from cached_tokens or "
        "timing what they sent.",
    )
    allow_pin_prefix = models.BooleanField(
        "may pin prefixes", default=False, help_text="May send x-superfluid-pin-prefix: true (else 403)."
    )
    is_admin = models.BooleanField(
        "admin", default=False, help_text="May use the admin routes (/slots, /v1/internal/state) and see every key's metrics."
    )
    created = models.DateTimeField(default=timezone.now, editable=False)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "key policy"
        verbose_name_plural = "key policies"

    def __str__(self) -> str:
        return self.name

    @property
    def model_list(self) -> list[str]:
        return [m for m in (p.strip() for p in self.allowed_models.replace("\n", ",").split(",")) if m]

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.max_class is not None and self.default_class is not None and self.max_class > self.default_class:
            errors["max_class"] = (
                f"The best class ({QosClass(self.max_class).label}) must be at least as good as the "
                f"default class ({QosClass(self.default_class).label})."
            )
        for field in ("rate_limit_rpm", "max_concurrent"):
            value = getattr(self, field)
            if value is not None and value > MAX_LIMIT:
                errors[field] = f"Must be at most {MAX_LIMIT:,} (0 = unlimited)."
        if self.priority_offset is not None and abs(self.priority_offset) > MAX_PRIORITY_OFFSET:
            errors["priority_offset"] = (
                f"The offset must be between -{MAX_PRIORITY_OFFSET} and {MAX_PRIORITY_OFFSET}, so that with the swap "
                f"affinity bonus ({SWAP_AFFINITY_BONUS}) it stays below half the band spacing ({BAND_SPACING})."
            )
        unknown = self._unknown_models()
        if unknown:
            errors["allowed_models"] = (
                f"No model is served under {', '.join(repr(m) for m in unknown)}: a request must name a served "
                f"model by its id or an alias (one of: {', '.join(sorted(served_names()))}), so this policy's keys "
                "could never use it. Empty = all models."
            )
        from .policyfile import file_keys

        stored = KeyPolicy.objects.filter(pk=self.pk).values_list("name", flat=True).first() if self.pk is not None else None
        if stored is not None and self.name != stored and stored == static_key_policy():
            # the static key finds its policy by this name: renamed, every request with it is 401
            errors["name"] = (
                f"The static key ({STATIC_KEY_NAME}) follows this policy by its name (SUPERFLUID_API_KEY_POLICY="
                f"{stored}): renamed, the key would be refused. Change the variable first."
            )
        if self.name != stored and self.name in file_keys().policies:  # every file key's policy is one
            # limits and the prefix-cache scope go by the policy's name: two tenants would share them.
            # Checked for a new name only: a policy named so before the file said it is the one in
            # force (the file's keys under that name are left out) and stays editable.
            errors["name"] = f"{self.name} is the name of a policy in the --key-policy file."
        if errors:
            raise ValidationError(errors)

    def _unknown_models(self) -> list[str]:
        """The listed models no request can name (a typo, another case): a request naming
        anything but a served id or alias is 404 before its key's list is read, so such an entry
        allows nothing, and a list of only such entries locks the policy's keys out of every
        model (403 ``model_forbidden``). Entries the saved row already lists stay (a model no
        longer served must not make the rest of the policy uneditable); a process that does not
        know the served models (no serve, no worker yet) accepts any."""
        served = served_names()
        if not served:
            return []
        before = KeyPolicy.objects.filter(pk=self.pk).values_list("allowed_models", flat=True).first() if self.pk is not None else None
        kept = set(KeyPolicy(allowed_models=before).model_list) if before else set()
        return [m for m in dict.fromkeys(self.model_list) if m not in served and m not in kept]


def static_key_policy() -> str | None:
    """The name of the policy the static key (``SUPERFLUID_API_KEY``) follows, where there is
    such a key and it names one (``SUPERFLUID_API_KEY_POLICY``); else None. It follows it by name,
    not as a row: deleted or renamed, the key is refused."""
    from django.conf import settings

    if not getattr(settings, "SUPERFLUID_API_KEY_SHA256", ""):
        return None
    return str(getattr(settings, "SUPERFLUID_API_KEY_POLICY", "") or "") or None


def served_names() -> set[str]:
    """Every name a request may give its model here: each served id and, with several models,
    each alias; empty where this process does not know them."""
    cfg = serving()
    return set(cfg.models) | {name for name, _path in cfg.model_paths}


class ApiKey(models.Model):
    name = models.CharField(max_length=100, unique=True, help_text="Shown in logs, metrics and the activity log.")
    prefix = models.CharField(max_length=16, editable=False, help_text="The first characters of the secret.")
    digest = models.CharField(max_length=64, unique=True, editable=False)  # sha256 hex of the secret
    policy = models.ForeignKey(
        KeyPolicy,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="keys",
        help_text="Empty = the server's defaults (--http-default-qos, any class the header asks, no limits).",
    )
    owner = models.CharField(max_length=200, blank=True)
    notes = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    expires = models.DateTimeField(null=True, blank=True, help_text="Refused from this time on. Empty = never.")
    revoked = models.BooleanField(default=False)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return self.name

    def is_expired(self, now: object | None = None) -> bool:
        return self.expires is not None and self.expires <= (now or timezone.now())

    def clean(self) -> None:
        if self.pk is not None:
            # a key's name never changes (keys.actions.save_key refuses a rename): the checks below
            # are for new keys; a key made before its name was taken elsewhere (the --key-policy
            # file names a key as it, which is then left out) must still be editable, revocable
            return
        if self.expires is not None and self.expires <= timezone.now():
            # the server would refuse it from its first request (createkey: --expires-days more than 0)
            raise ValidationError({"expires": "A new key's expiry must be in the future (empty = never)."})
        if self.name == STATIC_KEY_NAME:
            # the environment's static key goes by this name: its limits and usage would mix
            raise ValidationError({"name": f"{STATIC_KEY_NAME} is the name of the static key from the environment."})
        if self.name in RESERVED_KEY_NAMES:
            raise ValidationError({"name": f"{self.name} is what /metrics or the logs call requests made without a key."})
        from .policyfile import file_keys

        if self.name in {k.name for k in file_keys().values()}:
            # limits, slots, metrics, files and batches go by the key's name: two holders would share them
            raise ValidationError({"name": f"{self.name} is the name of a key in the --key-policy file."})
        if _owns_batch_data(self.name):
            # they go by the name: a new key of a deleted one's name would be handed them
            raise ValidationError(
                {"name": f"A deleted key named {self.name} still owns files or batches: delete them first "
                 "(admin, Batches) or choose another name."}
            )


def _owns_batch_data(name: str) -> bool:
    if not apps.is_installed("batches"):
        return False
    return any(apps.get_model("batches", m).objects.filter(owner=name).exists() for m in ("File", "Batch"))


class ClassLaneCap(models.Model):
    model = models.CharField(max_length=200, blank=True, help_text="Model id; empty = all models.")
    qos_class = models.PositiveSmallIntegerField("class", choices=QOS_CHOICES)
    max_lanes = models.PositiveSmallIntegerField(help_text="The most lanes this class may hold, 1..--max-batch.")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "qos_class"]
        verbose_name = "class-lane cap"
        constraints = [models.UniqueConstraint(fields=["model", "qos_class"], name="keys_classlanecap_model_class")]

    def __str__(self) -> str:
        return f"{self.model or 'all models'}: {QosClass(self.qos_class).label} <= {self.max_lanes}"

    def clean(self) -> None:
        from scheduler.link.pool import model_lanes

        max_batch = int(serving().max_batch)  # several models: the largest model's lanes
        own = model_lanes().get(self.model) if self.model else None
        if self.max_lanes is not None and own and not 1 <= self.max_lanes <= own:
            # the model's worker checks a cap against its own lanes and ignores one above them
            raise ValidationError({"max_lanes": f"Must be between 1 and {self.model}'s {own} lanes (its worker's --max-batch)."})
        if self.max_lanes is not None and not 1 <= self.max_lanes <= max_batch:
            raise ValidationError({"max_lanes": lanes_range_message()})
        served = serving().models  # empty where this process does not know them (no serve, no worker yet)
        if self.model and served and self.model not in served:
            raise ValidationError(
                {"model": f"No model is served under the id {self.model!r}: caps go by a model's id "
                 f"(one of: {', '.join(sorted(served))}); empty = all models."}
            )


def lanes_range_message() -> str:
    """What a class-lane cap outside 1..--max-batch is told (the largest model's lanes with several)."""
    return f"Must be between 1 and the worker's --max-batch ({int(serving().max_batch)})."


class ConfigVersion(models.Model):
    """One row whose number goes up with every change to keys, policies or caps."""

    version = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "configuration version"

    def __str__(self) -> str:
        return str(self.version)
