"""A person's settings page: messages about questions waiting for them, on or off."""

from __future__ import annotations

from django.urls import reverse

from elicitations import notices
from elicitations.models import NoticePreference

URL = "/settings/"


def test_the_nav_links_to_it(client, operator) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    page = client.get(reverse("elicitations:inbox")).content.decode()
    assert f'<a href="{URL}"' in page


def test_messages_are_on_until_turned_off(client, operator) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    page = client.get(URL).content.decode()
    assert 'value="on" checked' in page

    answer = client.post(URL, {"messages": "off"}, follow=True)

    assert "Messages about questions are off." in answer.content.decode()
    assert 'value="off" checked' in answer.content.decode()
    assert not notices.messages_on(operator.pk)
    client.post(URL, {"messages": "on"})
    assert notices.messages_on(operator.pk)
    assert NoticePreference.objects.get(user=operator).enabled


def test_a_choice_that_is_neither_is_refused(client, operator) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    assert client.post(URL, {"messages": "maybe"}).status_code == 400
    assert notices.messages_on(operator.pk)


def test_it_needs_a_login(client) -> None:  # type: ignore[no-untyped-def]
    answer = client.get(URL)
    assert answer.status_code == 302
    assert answer["Location"].startswith("/accounts/login/")


def test_it_changes_only_ones_own(client, operator, viewer) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    client.post(URL, {"messages": "off"})
    assert notices.messages_on(operator.pk)
    assert not notices.messages_on(viewer.pk)
