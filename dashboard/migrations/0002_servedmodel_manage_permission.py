from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("dashboard", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="servedmodel",
            options={
                "default_permissions": ("view",),
                "managed": False,
                "permissions": [("manage_servedmodel", "Can load and unload served models")],
                "verbose_name": "served model",
                "verbose_name_plural": "served models",
            },
        ),
    ]
