"""The shop, served for real: browse, fill a cart, order, and run out of stock, as one process and as three
services calling each other over HTTP."""

import pytest
from typer.testing import CliRunner


@pytest.fixture(params=["all-in-one", "three-services"])
def shop(request, serve, tmp_path):
    """The shop's front: one process, or catalogue + cart + orders each in its own process and database."""
    if request.param == "all-in-one":
        app = serve("shop", "--db", str(tmp_path / "shop.db"))
        return app, app, app
    cat = serve("shop", "--part", "catalogue", "--db", str(tmp_path / "catalogue.db"))
    cart = serve("shop", "--part", "cart", "--db", str(tmp_path / "cart.db"), "--catalogue-url", cat.url)
    orders = serve("shop", "--part", "orders", "--db", str(tmp_path / "orders.db"),
                   "--catalogue-url", cat.url, "--cart-url", cart.url)
    return cat, cart, orders


def test_shop_flow(shop):
    cat, cart, orders = shop
    products = cat.get("/api/products").json()
    assert len(products) == 20
    p = products[0]
    cid = cart.post("/api/carts").json()["cart_id"]
    content = cart.post(f"/api/carts/{cid}/items", json={"product_id": p["id"], "quantity": 3}).json()
    assert content["total_cents"] == 3 * p["price_cents"] and content["items"][0]["name"] == p["name"]
    order = orders.post("/api/orders", json={"cart_id": cid})
    assert order.status_code == 201, order.text
    oid = order.json()["order_id"]
    assert orders.get(f"/api/orders/{oid}").json()["lines"][0]["quantity"] == 3
    assert cat.get(f"/api/products/{p['id']}").json()["stock"] == p["stock"] - 3
    assert cart.get(f"/api/carts/{cid}").json()["items"] == []  # the order emptied the cart
    assert orders.post("/api/orders", json={"cart_id": cid}).status_code == 400  # empty cart


def test_shop_rejects_bad_input_and_overselling(shop):
    cat, cart, orders = shop
    cid = cart.post("/api/carts").json()["cart_id"]
    for bad in ({"product_id": 1, "quantity": 0}, {"product_id": 1, "quantity": "2"}, {"product_id": -1, "quantity": 1}, {}):
        assert cart.post(f"/api/carts/{cid}/items", json=bad).status_code == 400, bad
    assert cart.post(f"/api/carts/{cid}/items", json={"product_id": 999, "quantity": 1}).status_code == 404
    assert cart.get("/api/carts/nope").status_code == 404
    assert orders.post("/api/orders", json={"cart_id": "nope"}).status_code == 404  # the cart service's 404
    # 1000 in stock; eleven orders of 100 must leave the eleventh short, and take nothing.
    codes = []
    for _ in range(11):
        c = cart.post("/api/carts").json()["cart_id"]
        cart.post(f"/api/carts/{c}/items", json={"product_id": 2, "quantity": 100})
        codes.append(orders.post("/api/orders", json={"cart_id": c}).status_code)
    assert codes == [201] * 10 + [409]
    assert cat.get("/api/products/2").json()["stock"] == 0


def test_split_service_without_its_neighbours_is_refused():
    from joulesched.pipelines.cli import app

    r = CliRunner().invoke(app, ["workload", "serve", "shop", "--part", "orders", "--listen", "127.0.0.1:0"])
    assert r.exit_code == 2 and "needs --catalogue-url" in r.output


def test_orders_report_an_unreachable_catalogue_as_502(serve, tmp_path):
    cart = serve("shop", "--part", "cart", "--db", str(tmp_path / "c.db"), "--catalogue-url", "http://127.0.0.1:9")
    cid = cart.post("/api/carts").json()["cart_id"]
    r = cart.post(f"/api/carts/{cid}/items", json={"product_id": 1, "quantity": 1})
    assert r.status_code == 502 and "unreachable" in r.json()["error"]


@pytest.fixture
def shop_client(tmp_path):
    from joulesched.workloads.shop import create_app

    return create_app(tmp_path / "shop.db").test_client()


def test_ids_beyond_sqlite_integers_are_404_or_400_not_500(shop_client):
    huge = "99999999999999999999999"
    assert shop_client.get(f"/api/products/{huge}").status_code == 404
    assert shop_client.get(f"/api/products/{2**63}").status_code == 404
    assert shop_client.get(f"/api/products/{2**63 - 1}").json["error"] == f"no product {2**63 - 1}"
    assert shop_client.get(f"/api/orders/{huge}").status_code == 404
    cid = shop_client.post("/api/carts").json["cart_id"]
    for path, body in ((f"/api/carts/{cid}/items", {"product_id": int(huge), "quantity": 1}),
                       ("/api/products/reserve", {"lines": [{"product_id": 2**63, "quantity": 1}]})):
        r = shop_client.post(path, json=body)
        assert r.status_code == 400 and "product_id" in r.json["error"], (path, r.json)


def test_concurrent_orders_on_one_cart_place_one_order(shop_client, monkeypatch):
    """The second order of a cart while the first is between reading the cart and emptying it is a 409: both
    would otherwise read the same items and take their stock twice."""
    import threading

    from joulesched.workloads import shop

    cid = shop_client.post("/api/carts").json["cart_id"]
    shop_client.post(f"/api/carts/{cid}/items", json={"product_id": 3, "quantity": 2})
    stock = shop_client.get("/api/products/3").json["stock"]
    entered, release = threading.Event(), threading.Event()
    reserve = shop.Catalogue.reserve

    def slow_reserve(self, lines, rid=None):  # hold the first order inside its critical steps
        entered.set()
        release.wait(10)
        return reserve(self, lines, rid)

    monkeypatch.setattr(shop.Catalogue, "reserve", slow_reserve)
    codes = {}

    def order(name):
        codes[name] = shop_client.application.test_client().post("/api/orders", json={"cart_id": cid}).status_code

    first = threading.Thread(target=order, args=("first",))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=order, args=("second",))
    second.start()
    second.join(2)  # a 409 comes at once; without the claim the second order would wait in reserve too
    release.set()
    first.join(10)
    second.join(10)
    assert codes == {"first": 201, "second": 409}
    assert shop_client.get("/api/products/3").json["stock"] == stock - 2
    assert shop_client.post("/api/orders", json={"cart_id": cid}).status_code == 400  # ordered: the cart is empty


def test_a_reservation_no_order_records_is_given_back(shop_client, monkeypatch):
    """A reserve whose answer was lost (the catalogue committed, the orders service saw a 502), and one made for
    an order that then could not be recorded, kept their stock for good before (a review)."""
    from joulesched.workloads import shop

    stock = lambda: shop_client.get("/api/products/4").json["stock"]  # noqa: E731
    before = stock()
    reserve = shop.Catalogue.reserve

    def answer_lost(self, lines, rid=None):
        reserve(self, lines, rid)  # committed...
        raise shop.ShopError("upstream http://catalogue unreachable: ReadTimeout", 502)  # ...but never answered

    cid = shop_client.post("/api/carts").json["cart_id"]
    shop_client.post(f"/api/carts/{cid}/items", json={"product_id": 4, "quantity": 5})
    monkeypatch.setattr(shop.Catalogue, "reserve", answer_lost)
    r = shop_client.post("/api/orders", json={"cart_id": cid})
    assert r.status_code == 502 and stock() == before, (r.json, stock())
    monkeypatch.setattr(shop.Catalogue, "reserve", reserve)

    real_connect = shop._connect

    def orders_db_broken(path):  # the orders service's own write fails after the reserve succeeded
        db = real_connect(path)
        db.execute("DROP TABLE IF EXISTS order_lines")
        return db

    # Break only the recording: the reserve has run by the time the order's lines are written.
    real_reserve = shop.Catalogue.reserve

    def reserve_then_break(self, lines, rid=None):
        out = real_reserve(self, lines, rid)
        monkeypatch.setattr(shop, "_connect", orders_db_broken)
        return out

    monkeypatch.setattr(shop.Catalogue, "reserve", reserve_then_break)
    assert shop_client.post("/api/orders", json={"cart_id": cid}).status_code == 500  # no such table
    monkeypatch.setattr(shop, "_connect", real_connect)
    assert stock() == before
    assert shop_client.get(f"/api/carts/{cid}").json["items"] != []  # no order: the cart keeps its items


def test_reservations_by_id_are_idempotent_and_a_release_outruns_a_late_reserve(serve, tmp_path):
    """Over HTTP, as the split orders service calls it: the same id again takes nothing more; a release that
    arrives before its reserve (held up on the network) makes the reserve a 409 that takes nothing."""
    import requests

    from joulesched.workloads.shop import CatalogueHTTP, ShopError

    cat = serve("shop", "--part", "catalogue", "--db", str(tmp_path / "catalogue.db"))
    api = CatalogueHTTP(cat.url)
    stock = lambda: cat.get("/api/products/5").json()["stock"]  # noqa: E731
    before = stock()
    lines = [{"product_id": 5, "quantity": 7}]
    first = api.reserve(lines, "a" * 32)
    assert api.reserve(lines, "a" * 32) == first and stock() == before - 7  # the retry took nothing more
    assert api.release("a" * 32) is True and stock() == before
    assert api.release("a" * 32) is False and stock() == before  # once
    assert api.release("b" * 32) is False  # not reserved yet: recorded as released
    with pytest.raises(ShopError, match="was released") as late:
        api.reserve(lines, "b" * 32)
    assert late.value.status == 409 and stock() == before
    assert requests.delete(cat.url + "/api/products/reservations/..%2Fx", timeout=5).status_code == 404
    for bad in ("not-hex", "XXX" + "a" * 32 + "/../zz"):  # the pattern was a search: the second passed
        r = cat.post("/api/products/reserve", json={"lines": lines, "reservation_id": bad})
        assert r.status_code == 400 and "reservation_id" in r.json()["error"], bad


def test_without_db_the_shop_removes_its_database_folder_on_sigterm(tmp_path, monkeypatch):
    """The default database lives in a temp folder of its own, which outlived every run before."""
    from tests.workloads.conftest import start_app, stop_app

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the app's own temp folder, where it makes the database's
    app = start_app("shop", stderr_path=tmp_path / "shop.stderr")
    try:
        r = app.post("/api/carts", json={})
        assert r.status_code in (200, 201), r.text
        made = list(tmp.glob("joulesched-shop-*"))
        assert len(made) == 1 and (made[0] / "shop.db").is_file()
    finally:
        assert stop_app(app) == []
    assert app.proc.returncode is not None and list(tmp.iterdir()) == [], (tmp_path / "shop.stderr").read_text()
