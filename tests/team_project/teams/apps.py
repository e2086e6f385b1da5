from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "tests.team_project.teams"
    label = "teams"
    default_auto_field = "django.db.models.BigAutoField"
