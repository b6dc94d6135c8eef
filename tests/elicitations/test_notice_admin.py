"""The admin of question routes and chat webhooks: tenant-scoped, URLs checked like webhooks."""

from __future__ import annotations

from django.contrib.auth.models import Group

from elicitations.models import QuestionRoute, TenantChat


def test_a_superuser_routes_a_tools_questions_to_a_group(admin_client, alice) -> None:  # type: ignore[no-untyped-def]
    group = Group.objects.create(name="refunds")
    answer = admin_client.post(
        "/admin/elicitations/questionroute/add/",
        {"tenant": alice.tenant.pk, "tool_name": "refund_payment", "group": group.pk},
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    route = QuestionRoute.objects.get()
    assert (route.tenant, route.tool_name, route.group) == (alice.tenant, "refund_payment", group)


def test_a_chat_webhook_to_a_private_address_is_refused(admin_client, alice) -> None:  # type: ignore[no-untyped-def]
    answer = admin_client.post(
        "/admin/elicitations/tenantchat/add/",
        {"tenant": alice.tenant.pk, "webhook_url": "http://10.0.0.5/hooks", "enabled": "on"},
    )
    assert answer.status_code == 200
    assert "This webhook URL is refused" in answer.content.decode()
    assert not TenantChat.objects.exists()


def test_staff_see_the_routes_of_their_tenants_only(client, alice, bob, django_user_model) -> None:  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user(username="sam", password="pw", is_staff=True)
    alice.tenant.members.add(staff)
    staff.user_permissions.add(*Permission.objects.filter(codename__endswith="questionroute"))
    QuestionRoute.objects.create(tenant=alice.tenant, tool_name="mine")
    QuestionRoute.objects.create(tenant=bob.tenant, tool_name="theirs")
    client.force_login(staff)
    page = client.get("/admin/elicitations/questionroute/").content.decode()
    assert "mine" in page and "theirs" not in page
