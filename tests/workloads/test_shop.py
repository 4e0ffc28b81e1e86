"""The shop, served for real: browse, fill a cart, order, and run out of stock."""


def test_shop_flow(serve, tmp_path):
    app = serve("shop", "--db", str(tmp_path / "shop.db"))
    products = app.get("/api/products").json()
    assert len(products) == 20
    p = products[0]
    cid = app.post("/api/carts").json()["cart_id"]
    cart = app.post(f"/api/carts/{cid}/items", json={"product_id": p["id"], "quantity": 3}).json()
    assert cart["total_cents"] == 3 * p["price_cents"]
    order = app.post("/api/orders", json={"cart_id": cid})
    assert order.status_code == 201
    oid = order.json()["order_id"]
    assert app.get(f"/api/orders/{oid}").json()["lines"][0]["quantity"] == 3
    assert app.get(f"/api/products/{p['id']}").json()["stock"] == p["stock"] - 3
    assert app.get(f"/api/carts/{cid}").json()["items"] == []  # the order emptied the cart
    assert app.post("/api/orders", json={"cart_id": cid}).status_code == 400  # empty cart


def test_shop_rejects_bad_input_and_overselling(serve, tmp_path):
    app = serve("shop", "--db", str(tmp_path / "shop.db"))
    cid = app.post("/api/carts").json()["cart_id"]
    for bad in ({"product_id": 1, "quantity": 0}, {"product_id": 1, "quantity": "2"}, {"product_id": -1, "quantity": 1}, {}):
        assert app.post(f"/api/carts/{cid}/items", json=bad).status_code == 400, bad
    assert app.post(f"/api/carts/{cid}/items", json={"product_id": 999, "quantity": 1}).status_code == 404
    assert app.get("/api/carts/nope").status_code == 404
    # 1000 in stock; eleven orders of 100 must leave the eleventh short.
    codes = []
    for _ in range(11):
        c = app.post("/api/carts").json()["cart_id"]
        app.post(f"/api/carts/{c}/items", json={"product_id": 2, "quantity": 100})
        codes.append(app.post("/api/orders", json={"cart_id": c}).status_code)
    assert codes == [201] * 10 + [409]
    assert app.get("/api/products/2").json()["stock"] == 0
