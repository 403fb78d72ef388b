"""The dashboard keeps no data. ``ServedModel`` is unmanaged (no table): it only gives the admin a
"Served models" entry, whose page shows the running server's models and loads or unloads them
(dashboard/admin.py), and a content type the admin's log records those actions under."""

from django.db import models


class ServedModel(models.Model):
    id = models.CharField(primary_key=True, max_length=200)

    class Meta:
        managed = False
        verbose_name = "served model"
        verbose_name_plural = "served models"
        default_permissions = ("view",)
        permissions = [("manage_servedmodel", "Can load and unload served models")]

    def __str__(self) -> str:
        return self.id
