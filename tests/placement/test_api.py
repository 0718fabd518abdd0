"""The placement API, endpoint by endpoint, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import httpx

from .conftest import make_client

MAX = "1.39"  # the newest microversion served
V1_18 = {"openstack-api-version": "placement 1.18"}  # aggregates as a plain list (1.19 adds a generation)


def new_provider(client: httpx.Client, name: str, **body: object) -> str:
    response = client.post("/resource_providers", json={"name": name, **body})
    assert response.status_code in (200, 201), response.text  # 200 with the provider from 1.20
    return response.headers["location"].rsplit("/", 1)[1]


def set_inventory(client: httpx.Client, rp: str, **inventories: dict) -> int:
    generation = client.get(f"/resource_providers/{rp}").json()["generation"]
    response = client.put(
        f"/resource_providers/{rp}/inventories",
        json={"resource_provider_generation": generation, "inventories": inventories},
    )
    assert response.status_code == 200, response.text
    return response.json()["resource_provider_generation"]


def error_code(response: httpx.Response) -> str:
    return response.json()["errors"][0]["code"]


def test_version_root_needs_no_token(store):
    with make_client(store) as client:
        response = client.get("/", headers={"x-auth-token": "", "openstack-api-version": "placement latest"})
    assert response.status_code == 200
    (version,) = response.json()["versions"]
    assert version["min_version"] == "1.0" and version["max_version"] == MAX
    assert response.headers["openstack-api-version"] == f"placement {MAX}"
    assert "openstack-api-version" in response.headers["vary"]


def test_microversion_negotiation(client):
    assert (
        client.get("/", headers={"openstack-api-version": "placement 1.4"}).headers["openstack-api-version"]
        == "placement 1.4"
    )
    assert (
        client.get("/resource_providers", headers={"openstack-api-version": ""}).headers["openstack-api-version"]
        == "placement 1.0"
    )
    bad = client.get("/resource_providers", headers={"openstack-api-version": "placement 1.x"})
    assert bad.status_code == 400
    high = client.get("/resource_providers", headers={"openstack-api-version": "placement 1.40"})
    assert high.status_code == 406
    assert high.json()["errors"][0]["max_version"] == MAX
    # Endpoints newer than the asked version do not exist for it.
    assert client.get("/traits", headers={"openstack-api-version": "placement 1.5"}).status_code == 404
    assert client.get("/traits", headers={"openstack-api-version": "placement 1.6"}).status_code == 200


def test_token_required(store):
    with make_client(store) as client:
        response = client.get("/resource_providers", headers={"x-auth-token": ""})
    assert response.status_code == 401
    error = response.json()["errors"][0]
    assert set(error) >= {"status", "title", "detail", "code", "request_id"}


def test_configured_token(store):
    from devtag_host.placement.app import Placement

    app = Placement(store, auth_token="s3cret")
    with httpx.Client(transport=httpx.WSGITransport(app=app.wsgi), base_url="http://p") as client:
        assert client.get("/resource_providers", headers={"x-auth-token": "admin"}).status_code == 401
        assert client.get("/resource_providers", headers={"x-auth-token": "s3cret"}).status_code == 200


def test_unknown_path_method_and_media_type(client):
    assert client.get("/nope").status_code == 404
    response = client.patch("/resource_providers")
    assert response.status_code == 405
    assert "GET" in response.headers["allow"]
    response = client.post("/resource_providers", content=b'{"name": "x"}', headers={"content-type": "text/plain"})
    assert response.status_code == 415
    response = client.post("/resource_providers", content=b"{", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert client.get("/resource_providers", headers={"accept": "text/html"}).status_code == 406


def test_provider_lifecycle(client):
    rp = new_provider(client, "cn1")
    body = client.get(f"/resource_providers/{rp}").json()
    assert body["name"] == "cn1" and body["generation"] == 0
    assert body["root_provider_uuid"] == rp and body["parent_provider_uuid"] is None
    rels = {link["rel"] for link in body["links"]}
    assert rels == {"self", "inventories", "usages", "aggregates", "traits", "allocations"}
    old = client.get(f"/resource_providers/{rp}", headers={"openstack-api-version": "placement 1.0"}).json()
    assert {link["rel"] for link in old["links"]} == {"self", "inventories", "usages"}
    assert "root_provider_uuid" not in old
    duplicate = client.post("/resource_providers", json={"name": "cn1"})
    assert duplicate.status_code == 409 and error_code(duplicate) == "placement.duplicate_name"
    renamed = client.put(f"/resource_providers/{rp}", json={"name": "cn1-renamed"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "cn1-renamed"
    assert client.delete(f"/resource_providers/{rp}").status_code == 204
    missing = client.get(f"/resource_providers/{rp}")
    # Upstream names no code of its own for an unknown provider (only reshaper does).
    assert missing.status_code == 404 and error_code(missing) == "placement.undefined_code"
    gone = client.delete(f"/resource_providers/{rp}")
    assert gone.status_code == 404 and error_code(gone) == "placement.undefined_code"


def test_provider_with_given_uuid_and_bad_bodies(client):
    given = str(uuid.uuid4())
    assert new_provider(client, "pool", uuid=given) == given
    assert client.post("/resource_providers", json={"name": "x", "uuid": "not-a-uuid"}).status_code == 400
    assert client.post("/resource_providers", json={"name": "x", "extra": 1}).status_code == 400
    assert client.post("/resource_providers", json={"name": "n" * 201}).status_code == 400
    assert client.post("/resource_providers", json={"name": "y", "uuid": given}).status_code == 409


def test_nested_providers_and_in_tree(client):
    root = new_provider(client, "root")
    child = new_provider(client, "child", parent_provider_uuid=root)
    grandchild = new_provider(client, "grandchild", parent_provider_uuid=child)
    other = new_provider(client, "other")
    body = client.get(f"/resource_providers/{grandchild}").json()
    assert body["parent_provider_uuid"] == child and body["root_provider_uuid"] == root
    tree = client.get(f"/resource_providers?in_tree={child}").json()["resource_providers"]
    assert {p["uuid"] for p in tree} == {root, child, grandchild}
    assert other not in {p["uuid"] for p in tree}
    response = client.delete(f"/resource_providers/{root}")
    assert response.status_code == 409
    assert error_code(response) == "placement.resource_provider.cannot_delete_parent"
    assert (
        client.post("/resource_providers", json={"name": "x", "parent_provider_uuid": str(uuid.uuid4())}).status_code
        == 400
    )
    assert (
        client.put(f"/resource_providers/{child}", json={"name": "child", "parent_provider_uuid": other}).status_code
        == 400
    )


def test_inventories(client):
    rp = new_provider(client, "cn1")
    response = client.post(f"/resource_providers/{rp}/inventories", json={"resource_class": "VCPU", "total": 8})
    assert response.status_code == 201
    assert response.json() == {
        "resource_provider_generation": 1,
        "total": 8,
        "reserved": 0,
        "min_unit": 1,
        "max_unit": 2147483647,
        "step_size": 1,
        "allocation_ratio": 1.0,
    }
    again = client.post(f"/resource_providers/{rp}/inventories", json={"resource_class": "VCPU", "total": 8})
    assert again.status_code == 409
    stale = client.put(
        f"/resource_providers/{rp}/inventories/VCPU", json={"resource_provider_generation": 0, "total": 16}
    )
    assert stale.status_code == 409 and error_code(stale) == "placement.concurrent_update"
    fresh = client.put(
        f"/resource_providers/{rp}/inventories/VCPU",
        json={"resource_provider_generation": 1, "total": 16, "allocation_ratio": 4.0},
    )
    assert fresh.status_code == 200 and fresh.json()["resource_provider_generation"] == 2
    assert client.get(f"/resource_providers/{rp}/inventories/VCPU").json()["total"] == 16
    assert client.get(f"/resource_providers/{rp}/inventories/DISK_GB").status_code == 404
    unknown = client.put(
        f"/resource_providers/{rp}/inventories",
        json={"resource_provider_generation": 2, "inventories": {"CUSTOM_NOPE": {"total": 1}}},
    )
    assert unknown.status_code == 400
    reserved = client.put(
        f"/resource_providers/{rp}/inventories",
        json={"resource_provider_generation": 2, "inventories": {"VCPU": {"total": 1, "reserved": 1}}},
        headers={"openstack-api-version": "placement 1.25"},  # 1.26 allows reserved == total
    )
    assert reserved.status_code == 400
    assert client.delete(f"/resource_providers/{rp}/inventories/VCPU").status_code == 204
    assert client.delete(f"/resource_providers/{rp}/inventories/VCPU").status_code == 404
    set_inventory(client, rp, VCPU={"total": 4})
    old = client.delete(f"/resource_providers/{rp}/inventories", headers={"openstack-api-version": "placement 1.4"})
    assert old.status_code == 405 or old.status_code == 404
    assert client.delete(f"/resource_providers/{rp}/inventories").status_code == 204
    assert client.get(f"/resource_providers/{rp}/inventories").json()["inventories"] == {}


def test_allocations_capacity_and_usages(client):
    rp = new_provider(client, "cn1")
    set_inventory(
        client,
        rp,
        VCPU={"total": 4, "reserved": 1, "allocation_ratio": 2.0},
        MEMORY_MB={"total": 1024, "min_unit": 128, "max_unit": 512, "step_size": 128},
    )
    consumer = str(uuid.uuid4())
    body = {"allocations": {rp: {"resources": {"VCPU": 6, "MEMORY_MB": 512}}}, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{consumer}", json=body).status_code == 204
    # (4 - 1) * 2.0 - 6 = 0 left
    second = str(uuid.uuid4())
    over = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"}
    response = client.put(f"/allocations/{second}", json=over)
    assert response.status_code == 409 and "capacity" in response.json()["errors"][0]["detail"]
    for amount in (64, 640, 200):  # min_unit, max_unit, step_size
        bad = {"allocations": {rp: {"resources": {"MEMORY_MB": amount}}}, "project_id": "p", "user_id": "u"}
        assert client.put(f"/allocations/{second}", json=bad).status_code == 409
    got = client.get(f"/allocations/{consumer}").json()
    assert got["allocations"][rp]["resources"] == {"VCPU": 6, "MEMORY_MB": 512}
    assert got["project_id"] == "p" and got["user_id"] == "u"
    usages = client.get(f"/resource_providers/{rp}/usages").json()["usages"]
    assert usages == {"VCPU": 6, "MEMORY_MB": 512}
    assert client.get("/usages?project_id=p").json()["usages"] == {"VCPU": 6, "MEMORY_MB": 512}
    assert client.get("/usages?project_id=p&user_id=other").json()["usages"] == {}
    assert client.get("/usages").status_code == 400
    by_provider = client.get(f"/resource_providers/{rp}/allocations").json()["allocations"]
    assert by_provider == {consumer: {"resources": {"VCPU": 6, "MEMORY_MB": 512}}}
    in_use = client.delete(f"/resource_providers/{rp}/inventories/VCPU")
    assert in_use.status_code == 409 and error_code(in_use) == "placement.inventory.inuse"
    busy = client.delete(f"/resource_providers/{rp}")
    assert busy.status_code == 409 and error_code(busy) == "placement.resource_provider.inuse"
    # Replacing a consumer's allocations frees what it held.
    smaller = {"allocations": {rp: {"resources": {"VCPU": 2}}}, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{consumer}", json=smaller).status_code == 204
    assert client.get(f"/resource_providers/{rp}/usages").json()["usages"] == {"VCPU": 2, "MEMORY_MB": 0}
    assert client.delete(f"/allocations/{consumer}").status_code == 204
    assert client.delete(f"/allocations/{consumer}").status_code == 404
    assert client.delete(f"/resource_providers/{rp}").status_code == 204


def test_allocation_list_format_and_project_rules(client):
    rp = new_provider(client, "cn1")
    set_inventory(client, rp, DISK_GB={"total": 100})
    consumer = str(uuid.uuid4())
    listed = {"allocations": [{"resource_provider": {"uuid": rp}, "resources": {"DISK_GB": 10}}]}
    v1_0 = {"openstack-api-version": "placement 1.0"}
    assert client.put(f"/allocations/{consumer}", json=listed, headers=v1_0).status_code == 204
    v1_8 = {"openstack-api-version": "placement 1.8"}
    assert client.put(f"/allocations/{consumer}", json=listed, headers=v1_8).status_code == 400
    with_owner = {**listed, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{consumer}", json=with_owner, headers=v1_8).status_code == 204
    old = client.get(f"/allocations/{consumer}", headers=v1_8).json()
    assert "project_id" not in old and old["allocations"][rp]["resources"] == {"DISK_GB": 10}
    missing = {"allocations": {str(uuid.uuid4()): {"resources": {"DISK_GB": 1}}}, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{consumer}", json=missing).status_code == 400
    unknown_class = {"allocations": {rp: {"resources": {"CUSTOM_X": 1}}}, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{consumer}", json=unknown_class).status_code == 400
    no_inventory = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{consumer}", json=no_inventory).status_code == 409
    assert client.put("/allocations/not-a-uuid", json=with_owner).status_code == 400


def test_post_allocations_many_consumers(client):
    rp = new_provider(client, "cn1")
    set_inventory(client, rp, VCPU={"total": 2})
    first, second, third = (str(uuid.uuid4()) for _ in range(3))

    def entry(amount: int) -> dict:
        return {"allocations": {rp: {"resources": {"VCPU": amount}}}, "project_id": "p", "user_id": "u"}

    assert client.post("/allocations", json={first: entry(1), second: entry(1)}).status_code == 204
    # All or nothing: the third does not fit, so the move of the first is not applied either.
    response = client.post("/allocations", json={first: {**entry(1), "allocations": {}}, third: entry(2)})
    assert response.status_code == 409
    assert client.get(f"/allocations/{first}").json()["allocations"][rp]["resources"] == {"VCPU": 1}
    assert (
        client.post("/allocations", json={first: {**entry(1), "allocations": {}}, third: entry(1)}).status_code == 204
    )
    assert client.get(f"/allocations/{first}").json()["allocations"] == {}
    assert client.post("/allocations", json={}, headers={"openstack-api-version": "placement 1.13"}).status_code == 400
    assert client.post("/allocations", json={}, headers={"openstack-api-version": "placement 1.12"}).status_code in (
        404,
        405,
    )


def test_aggregates_and_member_of(client):
    a, b = new_provider(client, "a"), new_provider(client, "b")
    agg1, agg2 = str(uuid.uuid4()), str(uuid.uuid4())
    # A PUT answers the list as sent (upstream echoes it), a GET reads them back sorted.
    answer = client.put(f"/resource_providers/{a}/aggregates", json=[agg2, agg1], headers=V1_18)
    assert answer.json()["aggregates"] == [agg2, agg1]
    assert client.put(f"/resource_providers/{b}/aggregates", json=[agg2], headers=V1_18).status_code == 200
    assert client.get(f"/resource_providers/{a}/aggregates").json()["aggregates"] == sorted([agg1, agg2])
    assert client.put(f"/resource_providers/{a}/aggregates", json=["nope"], headers=V1_18).status_code == 400
    only1 = client.get(f"/resource_providers?member_of={agg1}").json()["resource_providers"]
    assert [p["uuid"] for p in only1] == [a]
    both = client.get(f"/resource_providers?member_of=in:{agg1},{agg2}").json()["resource_providers"]
    assert {p["uuid"] for p in both} == {a, b}
    assert client.get(f"/resource_providers?member_of={agg1},{agg2}").status_code == 400
    old = client.get(f"/resource_providers?member_of={agg1}", headers={"openstack-api-version": "placement 1.2"})
    assert old.status_code == 400
    assert (
        client.get(
            f"/resource_providers/{a}/aggregates", headers={"openstack-api-version": "placement 1.0"}
        ).status_code
        == 404
    )


def test_resources_filter(client):
    small, big = new_provider(client, "small"), new_provider(client, "big")
    set_inventory(client, small, VCPU={"total": 2}, MEMORY_MB={"total": 512})
    set_inventory(client, big, VCPU={"total": 32}, MEMORY_MB={"total": 8192})
    found = client.get("/resource_providers?resources=VCPU:4,MEMORY_MB:1024").json()["resource_providers"]
    assert [p["uuid"] for p in found] == [big]
    assert client.get("/resource_providers?resources=VCPU:0").status_code == 400
    assert client.get("/resource_providers?resources=VCPU").status_code == 400
    assert client.get("/resource_providers?resources=CUSTOM_NOPE:1").status_code == 400
    assert client.get("/resource_providers?bogus=1").status_code == 400


def test_traits(client):
    assert "HW_CPU_X86_AVX2" in client.get("/traits").json()["traits"]
    assert client.get("/traits/HW_CPU_X86_AVX2").status_code == 204
    assert client.put("/traits/CUSTOM_GOLD").status_code == 201
    assert client.put("/traits/CUSTOM_GOLD").status_code == 204
    assert client.put("/traits/GOLD").status_code == 400
    assert client.delete("/traits/HW_CPU_X86_AVX2").status_code == 400
    rp = new_provider(client, "cn1")
    response = client.put(
        f"/resource_providers/{rp}/traits",
        json={"traits": ["CUSTOM_GOLD", "HW_CPU_X86_AVX2"], "resource_provider_generation": 0},
    )
    assert response.status_code == 200
    assert response.json() == {"traits": ["CUSTOM_GOLD", "HW_CPU_X86_AVX2"], "resource_provider_generation": 1}
    stale = client.put(f"/resource_providers/{rp}/traits", json={"traits": [], "resource_provider_generation": 0})
    assert stale.status_code == 409 and error_code(stale) == "placement.concurrent_update"
    unknown = client.put(
        f"/resource_providers/{rp}/traits", json={"traits": ["CUSTOM_NOPE"], "resource_provider_generation": 1}
    )
    assert unknown.status_code == 400
    assert client.get("/traits?name=in:CUSTOM_GOLD,CUSTOM_NOPE").json()["traits"] == ["CUSTOM_GOLD"]
    assert client.get("/traits?name=startswith:CUSTOM_").json()["traits"] == ["CUSTOM_GOLD"]
    # As upstream: no colon is a 400 in its words, an unknown OP filters nothing.
    malformed = client.get("/traits?name=x")
    assert malformed.status_code == 400
    assert malformed.json()["errors"][0]["detail"].endswith('?name=[in|startswith]:[name1,name2|prefix]. Got: "x"')
    every = client.get("/traits").json()["traits"]
    assert client.get("/traits?name=other:CUSTOM_").json()["traits"] == every
    associated = client.get("/traits?associated=true").json()["traits"]
    assert associated == ["CUSTOM_GOLD", "HW_CPU_X86_AVX2"]
    assert client.delete("/traits/CUSTOM_GOLD").status_code == 409
    assert client.delete(f"/resource_providers/{rp}/traits").status_code == 204
    assert client.delete("/traits/CUSTOM_GOLD").status_code == 204
    assert client.get("/traits/CUSTOM_GOLD").status_code == 404


def test_resource_classes(client):
    names = [rc["name"] for rc in client.get("/resource_classes").json()["resource_classes"]]
    assert {"VCPU", "MEMORY_MB", "DISK_GB", "IPV4_ADDRESS"} <= set(names)
    assert client.post("/resource_classes", json={"name": "CUSTOM_FPGA"}).status_code == 201
    dup = client.post("/resource_classes", json={"name": "CUSTOM_FPGA"})
    assert dup.status_code == 409 and error_code(dup) == "placement.undefined_code"  # as upstream: no code here
    assert client.post("/resource_classes", json={"name": "FPGA"}).status_code == 400
    assert client.get("/resource_classes/CUSTOM_FPGA").json()["name"] == "CUSTOM_FPGA"
    assert client.put("/resource_classes/CUSTOM_GPU").status_code == 201
    assert client.put("/resource_classes/CUSTOM_GPU").status_code == 204
    v1_2 = {"openstack-api-version": "placement 1.2"}
    renamed = client.put("/resource_classes/CUSTOM_GPU", json={"name": "CUSTOM_VGPU"}, headers=v1_2)
    assert renamed.status_code == 200 and renamed.json()["name"] == "CUSTOM_VGPU"
    assert client.put("/resource_classes/VCPU", json={"name": "CUSTOM_X"}, headers=v1_2).status_code == 400
    rp = new_provider(client, "cn1")
    set_inventory(client, rp, CUSTOM_FPGA={"total": 2})
    in_use = client.delete("/resource_classes/CUSTOM_FPGA")
    assert in_use.status_code == 409
    assert in_use.json()["errors"][0]["detail"] == (
        "Error in delete resource class: Cannot delete resource class CUSTOM_FPGA. Class is in use in inventory."
    )  # upstream's words (the differential test found ours differed)
    standard = client.delete("/resource_classes/VCPU")
    assert standard.status_code == 400
    assert standard.json()["errors"][0]["detail"] == (
        "Error in delete resource class: Cannot delete standard resource class VCPU."
    )  # upstream's words (the random differential run found ours differed)
    # A name that is neither custom nor standard is looked up first: not found, as upstream
    # (the differential test found ours refused it as a standard class).
    assert client.delete("/resource_classes/BOGUS").status_code == 404
    assert client.put("/resource_classes/BOGUS", json={"name": "CUSTOM_X"}, headers=v1_2).status_code == 404
    assert client.delete("/resource_classes/CUSTOM_VGPU").status_code == 204
    assert client.get("/resource_classes/CUSTOM_VGPU").status_code == 404
    assert client.get("/resource_classes", headers={"openstack-api-version": "placement 1.1"}).status_code == 404


def test_cache_headers_from_1_15(client):
    assert (
        "last-modified"
        not in client.get("/resource_providers", headers={"openstack-api-version": "placement 1.14"}).headers
    )
    response = client.get("/resource_providers")
    assert response.headers["cache-control"] == "no-cache" and response.headers["last-modified"].endswith("GMT")


def test_details_as_openstack_placement_does_them(client):
    """Found by sending the same requests to openstack-placement 16.0.0 (in-process)."""
    assert client.post("/resource_providers", json={"name": ""}).status_code == 400
    rp = new_provider(client, "cn1")
    odd = {"resource_class": "DISK_GB", "total": 8, "min_unit": 5, "max_unit": 2}
    assert client.post(f"/resource_providers/{rp}/inventories", json=odd).status_code == 201
    assert client.get("/allocations/not-a-uuid").json() == {"allocations": {}}
    # Upstream compares the generation first (its words), then names every unknown trait.
    unknown_and_stale = {"traits": ["CUSTOM_NOPE"], "resource_provider_generation": 99}
    stale = client.put(f"/resource_providers/{rp}/traits", json=unknown_and_stale)
    assert stale.status_code == 409 and error_code(stale) == "placement.concurrent_update"
    assert "Resource provider's generation already changed. Please update the generation" in stale.text
    generation = client.get(f"/resource_providers/{rp}").json()["generation"]
    unknown = {"traits": ["CUSTOM_NOPE", "CUSTOM_B"], "resource_provider_generation": generation}
    answer = client.put(f"/resource_providers/{rp}/traits", json=unknown)
    assert answer.status_code == 400 and "No such trait CUSTOM_B, CUSTOM_NOPE" in answer.text
    # ... but the query filters stop at the first unknown one, as upstream's lookup does.
    listed = client.get("/resource_providers?required=CUSTOM_NOPE,CUSTOM_B")
    assert listed.status_code == 400
    detail = listed.json()["errors"][0]["detail"]
    assert detail == 'Invalid trait(s) in "required" parameter: No such trait(s): CUSTOM_NOPE.'
    # The body of PUT .../traits is read before the provider is looked up.
    missing = f"/resource_providers/{uuid.uuid4()}/traits"
    assert client.put(missing, json={"traits": "x"}).status_code == 400
    associated = client.get("/traits?associated=x")
    assert associated.json()["errors"][0]["detail"] == 'The query parameter "associated" only accepts "true" or "false"'
    response = client.get("/resource_providers", headers={"openstack-api-version": "placement 1.01"})
    assert response.headers["openstack-api-version"] == "placement 1.1"


def test_upstream_wording_and_order_of_provider_errors(client):
    """As OpenStack Placement: an unknown provider is a 404 before its body is
    read, and the messages are upstream's words (found by test_differential)."""
    missing = str(uuid.uuid4())
    for method, path, body in [
        ("PUT", f"/resource_providers/{missing}", {"bogus": 1}),
        ("PUT", f"/resource_providers/{missing}/aggregates", ["not-a-uuid"]),
        ("PUT", f"/resource_providers/{missing}/inventories", {"inventories": {"VCPU": {"total": 0}}}),
    ]:
        response = client.request(method, path, json=body)
        assert response.status_code == 404, (path, response.text)
    empty = client.post("/resource_providers", json={"name": "", "uuid": missing})
    assert empty.status_code == 400
    assert empty.json()["errors"][0]["detail"] == (
        f'Unable to create resource provider "", {missing}: Object action create failed because: name is required'
    )
    orphan = client.post("/resource_providers", json={"name": "x", "uuid": missing, "parent_provider_uuid": missing})
    assert "parent provider UUID cannot be same as UUID" in orphan.json()["errors"][0]["detail"]
    unknown = client.get("/allocation_candidates?resources=CUSTOM_NOPE:1")
    assert unknown.json()["errors"][0]["detail"] == (
        "Invalid resource class in resources parameter: No such resource class CUSTOM_NOPE."
    )
    old = client.delete(
        f"/resource_providers/{missing}/inventories", headers={"openstack-api-version": "placement 1.4"}
    )
    assert old.status_code == 405
    created = client.post("/resource_providers", json={"name": "cached", "uuid": str(uuid.uuid4())})
    assert created.status_code == 200, created.text
    renamed = client.put(f"/resource_providers/{created.json()['uuid']}", json={"name": "cached2"})
    assert renamed.headers["cache-control"] == "no-cache" and "last-modified" in renamed.headers  # 1.15+


def test_allocation_amounts_beyond_32_bits_meet_the_provider_checks_as_upstream(client):
    """Upstream's schema has no maximum for an amount: an unknown provider is named
    first (400), a known one refuses it by max_unit (409); never a schema error or a 500."""
    missing = str(uuid.uuid4())
    consumer = str(uuid.uuid4())
    for amount in (2**31, 2**63, 10**30):
        body = {"allocations": {missing: {"resources": {"VCPU": amount}}}, "project_id": "p", "user_id": "u"}
        unknown = client.put(f"/allocations/{consumer}", json=body)
        assert unknown.status_code == 400, unknown.text
        assert f"Allocation for resource provider '{missing}' that does not exist." in unknown.text
    rp = new_provider(client, "cn1")
    set_inventory(client, rp, VCPU={"total": 2147483647, "allocation_ratio": 16.0})
    for amount in (2**31, 2**63, 10**30):
        body = {"allocations": {rp: {"resources": {"VCPU": amount}}}, "project_id": "p", "user_id": "u"}
        refused = client.put(f"/allocations/{consumer}", json=body)
        assert refused.status_code == 409, refused.text
        assert "The requested amount would violate inventory constraints." in refused.text
    assert client.get(f"/resource_providers/{rp}/usages").json()["usages"] == {"VCPU": 0}


def test_inventory_capacity_checked_as_upstream(client):
    """Upstream checks an inventory's capacity int((total - reserved) * ratio), nothing
    else: positive before 1.26, not negative from 1.26, in its words; its schema sets
    no lower bound on allocation_ratio and lets the generation come along in POST."""
    rp = new_provider(client, "cn1")
    old, new = {"openstack-api-version": "placement 1.25"}, {"openstack-api-version": "placement 1.26"}

    def put(headers: dict, **record: object) -> httpx.Response:
        generation = client.get(f"/resource_providers/{rp}").json()["generation"]
        body = {"resource_provider_generation": generation, "inventories": {"VCPU": record}}
        return client.put(f"/resource_providers/{rp}/inventories", json=body, headers=headers)

    zero_ratio = put(old, total=4, allocation_ratio=0)
    assert zero_ratio.status_code == 400, zero_ratio.text
    assert (
        f"Unable to update inventory for resource provider {rp}: Invalid inventory for 'VCPU' on resource "
        f"provider '{rp}'. The reserved value is greater than or equal to total."
    ) in zero_ratio.text
    assert put(new, total=4, allocation_ratio=0).status_code == 200
    assert put(new, total=4, reserved=5, allocation_ratio=0).status_code == 200  # capacity int(-0.0) == 0
    negative = put(new, total=4, allocation_ratio=-1.5)
    assert negative.status_code == 400 and "The reserved value is greater than total." in negative.text
    created = client.post(
        f"/resource_providers/{rp}/inventories",
        json={"resource_class": "DISK_GB", "total": 4, "reserved": 4, "resource_provider_generation": 99},
        headers=old,
    )
    assert created.status_code == 400
    assert f"Unable to create inventory for resource provider {rp}: Invalid inventory for 'DISK_GB'" in created.text
    body = {"resource_class": "DISK_GB", "total": 4, "resource_provider_generation": 99}
    assert client.post(f"/resource_providers/{rp}/inventories", json=body).status_code == 201


def test_consumer_ids_spelled_as_upstream_stores_them(client):
    """A PUT's path id is stored in the canonical form (lower case, dashed); GET and
    DELETE look the path's id up as spelled, POST keys are stored as spelled; a
    provider is looked up as the body spells it (upper case: unknown)."""
    rp = new_provider(client, "cn1", uuid="aaaaaaaa-1111-4111-8111-111111111111")
    set_inventory(client, rp, VCPU={"total": 8})
    consumer = "c0000000-0000-4000-8000-0000000000ab"
    body = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"}
    for spelling in (consumer.upper(), consumer.replace("-", ""), "{" + consumer + "}", "urn:uuid:" + consumer):
        assert client.put(f"/allocations/{spelling}", json=body).status_code == 204, spelling
        assert client.get(f"/allocations/{consumer}").json()["allocations"][rp]["resources"] == {"VCPU": 1}
        if spelling != consumer:
            assert client.get(f"/allocations/{spelling}").json() == {"allocations": {}}
    listed = client.get(f"/resource_providers/{rp}/allocations").json()["allocations"]
    assert list(listed) == [consumer]
    assert client.put("/allocations/c0000000_0000_4000_8000_0000000000ab", json=body).status_code == 400
    assert client.delete(f"/allocations/{consumer.upper()}").status_code == 404
    gone = client.delete("/allocations/not-a-uuid")
    assert gone.status_code == 404 and "No allocations for consumer 'not-a-uuid'" in gone.text
    assert client.delete(f"/allocations/{consumer}").status_code == 204
    shouting = "C0000000-0000-4000-8000-0000000000CD"
    assert client.post("/allocations", json={shouting: body}).status_code == 204
    assert list(client.get(f"/resource_providers/{rp}/allocations").json()["allocations"]) == [shouting]
    upper_rp = {**body, "allocations": {rp.upper(): {"resources": {"VCPU": 1}}}}
    unknown = client.put(f"/allocations/{consumer}", json=upper_rp)
    assert unknown.status_code == 400 and "that does not exist" in unknown.text
    assert client.get(f"/resource_providers?uuid={rp.upper()}").json()["resource_providers"] == []
    assert client.get(f"/resource_providers?in_tree={rp.upper()}").json()["resource_providers"] == []


def _generation(client: httpx.Client, rp: str) -> int:
    return client.get(f"/resource_providers/{rp}").json()["generation"]


def test_only_providers_allocated_from_get_a_new_generation_as_upstream(client):
    """Upstream counts a write in the generations of the providers of the new
    allocations (and of a consumer a PUT/POST empties), not of providers that only
    lose allocations; a DELETE gives none a new generation."""
    one, two = new_provider(client, "cn1"), new_provider(client, "cn2")
    set_inventory(client, one, VCPU={"total": 4})
    set_inventory(client, two, VCPU={"total": 4})
    consumer, other = str(uuid.uuid4()), str(uuid.uuid4())
    owner = {"project_id": "p", "user_id": "u"}
    client.headers["openstack-api-version"] = "placement 1.28"

    def put(rp: str, generation: object) -> None:
        body = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "consumer_generation": generation, **owner}
        assert client.put(f"/allocations/{consumer}", json=body).status_code == 204

    put(one, None)
    assert (_generation(client, one), _generation(client, two)) == (2, 1)
    put(two, 1)  # moved: cn1 only loses
    assert (_generation(client, one), _generation(client, two)) == (2, 2)
    assert client.delete(f"/allocations/{consumer}").status_code == 204
    assert (_generation(client, one), _generation(client, two)) == (2, 2)
    # PUT with empty allocations (1.28) and POST of an emptied consumer count the
    # write in the emptied providers, as upstream's "used 0" allocations do.
    put(one, None)
    assert _generation(client, one) == 3
    body = {"allocations": {}, "consumer_generation": 1, **owner}
    assert client.put(f"/allocations/{consumer}", json=body).status_code == 204
    assert (_generation(client, one), _generation(client, two)) == (4, 2)
    put(one, None)
    new = {"allocations": {two: {"resources": {"VCPU": 2}}}, "consumer_generation": None, **owner}
    emptied = {"allocations": {}, "consumer_generation": 1, **owner}
    assert client.post("/allocations", json={consumer: emptied, other: new}).status_code == 204
    assert (_generation(client, one), _generation(client, two)) == (6, 3)
    # Moved by POST: the provider that only loses keeps its generation.
    moved = {"allocations": {one: {"resources": {"VCPU": 2}}}, "consumer_generation": 1, **owner}
    assert client.post("/allocations", json={other: moved}).status_code == 204
    assert (_generation(client, one), _generation(client, two)) == (7, 3)
    assert client.get(f"/resource_providers/{two}/usages").json()["usages"] == {"VCPU": 0}


def test_inventory_invalid_names_every_class_and_provider_as_upstream(client):
    """A provider with none of the write's classes: upstream names every class of the
    write (in its set order of class ids) and every such provider."""
    one, two = new_provider(client, "cn1"), new_provider(client, "cn2")
    v1_13 = {"openstack-api-version": "placement 1.13"}

    def post() -> httpx.Response:
        body = {
            str(uuid.UUID(int=1)): {
                "allocations": {one: {"resources": {"VCPU": 1}}, two: {"resources": {"MEMORY_MB": 1}}},
                "project_id": "p",
                "user_id": "u",
            }
        }
        return client.post("/allocations", json=body, headers=v1_13)

    response = post()
    assert response.status_code == 409
    detail = response.json()["errors"][0]["detail"]
    assert f"Inventory for 'VCPU, MEMORY_MB' on resource provider '{one}, {two}' invalid." in detail
    set_inventory(client, two, MEMORY_MB={"total": 4})
    response = post()
    assert response.status_code == 409
    assert (
        f"Inventory for 'VCPU, MEMORY_MB' on resource provider '{one}' invalid."
        in response.json()["errors"][0]["detail"]
    )
