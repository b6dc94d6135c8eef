"""The admin shows input requests read-only: answers go through the transitions."""

from __future__ import annotations


def test_the_admin_lists_and_shows_requests_read_only(client, ask, django_user_model) -> None:
    request = ask(message="Approve?")
    client.force_login(
        django_user_model.objects.create_superuser(username="root", password="pw-root-123")
    )

    listing = client.get("/admin/elicitations/inputrequest/")
    assert listing.status_code == 200
    assert request.key.encode() in listing.content
    detail = client.get(f"/admin/elicitations/inputrequest/{request.pk}/change/")
    assert detail.status_code == 200
    assert b'name="status"' not in detail.content  # no editable status field
    assert client.get("/admin/elicitations/inputrequest/add/").status_code == 403
    assert client.get(f"/admin/elicitations/inputrequest/{request.pk}/delete/").status_code == 403
