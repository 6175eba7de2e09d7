"""The price-list readers (`cloudtrain.plan.prices.*`) against a loopback stand-in of the three
price lists that answers from recorded pages (tests/data/prices/): real boto3 ``pricing`` and
``ec2`` clients, urllib, and google-auth's AuthorizedSession, as a user's machine runs them."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from cloudtrain.plan import catalog
from cloudtrain.plan.catalog import InstanceType
from cloudtrain.plan.prices import PriceListError, Quote
from cloudtrain.providers.aws import _prices as aws
from cloudtrain.providers.azure import _prices as azure
from cloudtrain.providers.gcp import _prices as gcp

DATA = Path(__file__).parents[1] / "data" / "prices"
HTML = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
CUT = b'{"skus": [{"name": "services/6F81-5844-456A/skus/1A2B", "desc'
TOKEN = "ya29.stand-in-token"


@dataclass
class Seen:
    """One request the stand-in got."""

    cloud: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass
class PriceLists:
    """The AWS Price List and EC2 APIs, the Azure Retail Prices API and the Cloud Billing
    Catalog API on one loopback server. `garbled[cloud]` is answered instead (status 200)."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    garbled: dict[str, bytes] = field(default_factory=dict)
    gcp_key: str = "test-api-key"

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL_PRICING": self.url,
            "AWS_ENDPOINT_URL_EC2": self.url,
            "CLOUDTRAIN_AZURE_PRICES_URL": f"{self.url}/azure/api/retail/prices",
            "CLOUDTRAIN_GCP_BILLING_ENDPOINT": f"{self.url}/gcp",
            "CLOUDTRAIN_GCP_API_KEY": self.gcp_key,
        }

    def requests(self, cloud: str) -> list[Seen]:
        return [s for s in self.seen if s.cloud == cloud]

    def answer(self, seen: Seen) -> tuple[int, str, bytes]:
        if seen.cloud in self.garbled:
            body = self.garbled[seen.cloud]
            return 200, "text/html" if body.startswith(b"<") else "application/json", body
        return getattr(self, f"_{seen.cloud}")(seen)  # type: ignore[no-any-return]

    def _pricing(self, seen: Seen) -> tuple[int, str, bytes]:
        request = json.loads(seen.body)
        filters = {f["Field"]: f["Value"] for f in request["Filters"]}
        pages = _recorded("aws-get-products.json").get(
            f"{filters['instanceType']} {filters['regionCode']}",
            [{"FormatVersion": "aws_v1", "PriceList": []}],
        )
        index = 0
        if "NextToken" in request:
            index = 1 + [p.get("NextToken") for p in pages].index(request["NextToken"])
        return 200, "application/x-amz-json-1.1", json.dumps(pages[index]).encode()

    def _ec2(self, seen: Seen) -> tuple[int, str, bytes]:
        form = parse_qs(seen.body.decode())
        scope = re.search(r"Credential=[^/]+/\d+/([\w-]+)/ec2/", seen.headers["authorization"])
        assert scope is not None
        region, number = scope.group(1), 1
        token = form.get("NextToken", [""])[0]
        while token:
            text = (DATA / f"spot-{region}-{number}.xml").read_text()
            number += 1
            if f"<nextToken>{token}</nextToken>" in text:
                break
        return 200, "text/xml", (DATA / f"spot-{region}-{number}.xml").read_bytes()

    def _azure(self, seen: Seen) -> tuple[int, str, bytes]:
        query = seen.query["$filter"][0]
        sku = re.search(r"armSkuName eq '([^']*)'", query)
        region = re.search(r"armRegionName eq '([^']*)'", query)
        assert sku, query
        assert region, query
        empty: dict[str, object] = {"BillingCurrency": "USD", "Items": [], "NextPageLink": None,
                                    "Count": 0}  # fmt: skip
        pages = _recorded("azure-retail.json").get(f"{sku[1]} {region[1]}", [empty])
        page = pages[int(seen.query.get("$skip", ["0"])[0]) // 100]
        text = json.dumps(page).replace("https://prices.azure.com:443", f"{self.url}/azure")
        return 200, "application/json; charset=utf-8", text.encode()

    def _gcp(self, seen: Seen) -> tuple[int, str, bytes]:
        bearer = seen.headers.get("authorization") == f"Bearer {TOKEN}"
        if seen.query.get("key") != [self.gcp_key] and not bearer:
            error = {"error": {"code": 403, "message": "API key not valid.", "status": "DENIED"}}
            return 403, "application/json", json.dumps(error).encode()
        pages = _recorded("gcp-skus.json")["pages"]
        token = seen.query.get("pageToken", [""])[0]
        index = 1 + [p["nextPageToken"] for p in pages].index(token) if token else 0
        return 200, "application/json", json.dumps(pages[index]).encode()

    def _token(self, seen: Seen) -> tuple[int, str, bytes]:
        answer = {"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"}
        return 200, "application/json", json.dumps(answer).encode()


def _recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def _cloud(method: str, path: str, headers: dict[str, str], body: bytes) -> str:
    if headers.get("x-amz-target") == "AWSPriceListService.GetProducts":
        return "pricing"
    if method == "POST" and b"Action=DescribeSpotPriceHistory" in body:
        return "ec2"
    if path == "/token":
        return "token"
    return path.split("/")[1]


def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[PriceLists]:
    """The stand-in, running, with the environment pointing every reader at it."""
    lists = PriceLists()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            parts = urlsplit(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen = Seen(
                _cloud(self.command, parts.path, headers, body),
                parts.path,
                parse_qs(parts.query),
                headers,
                body,
            )
            lists.seen.append(seen)
            status, kind, answer = lists.answer(seen)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = _serve

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    lists.url = f"http://127.0.0.1:{server.server_port}"
    for name, value in lists.env().items():
        monkeypatch.setenv(name, value)
    yield lists
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def price_lists(monkeypatch: pytest.MonkeyPatch) -> Iterator[PriceLists]:
    yield from serve(monkeypatch)


def rows(provider: str) -> list[InstanceType]:
    """The shipped catalog's rows of `provider` still sold: what an update asks for."""
    return [r for r in catalog.shipped().rows if r.provider == provider and not r.retired]


def _d(text: str) -> Decimal:
    return Decimal(text)


# --- AWS --------------------------------------------------------------------------------------


def test_aws_reads_ondemand_from_the_price_list_and_spot_from_the_zones(
    price_lists: PriceLists,
) -> None:
    reading = aws.read(rows("aws"))
    assert reading.quotes == {
        ("p3.2xlarge", "us-east-1"): Quote(_d("3.06"), _d("0.918")),  # the dearest zone's
        ("p3.8xlarge", "us-east-1"): Quote(_d("12.24"), _d("3.672")),
        ("p3.16xlarge", "us-east-1"): Quote(_d("24.48"), _d("7.344")),
        ("p3dn.24xlarge", "us-east-1"): Quote(_d("31.212"), _d("3.7457")),
        ("p4d.24xlarge", "us-east-1"): Quote(_d("21.9576"), _d("9.8307")),
        ("p4de.24xlarge", "us-east-1"): Quote(_d("27.447"), None),  # no spot price there
        ("p4d.24xlarge", "eu-west-1"): Quote(_d("23.995"), None),
        ("p3.2xlarge", "us-west-2"): Quote(_d("3.06"), _d("0.918")),
        ("p3.8xlarge", "us-west-2"): Quote(_d("12.24"), None),
        ("p3.16xlarge", "us-west-2"): Quote(_d("24.48"), None),
        ("p3dn.24xlarge", "us-west-2"): Quote(_d("31.212"), None),
        ("p4d.24xlarge", "us-west-2"): Quote(_d("21.9576"), _d("12.4")),
    }  # p3.2xlarge in eu-west-1: not in the recorded price list
    assert reading.problems == ()
    # the exact requests: one GetProducts per row (two pages for the first), its filters
    pricing = price_lists.requests("pricing")
    assert len(pricing) == 13 + 1
    first = json.loads(pricing[0].body)
    assert first == {
        "ServiceCode": "AmazonEC2",
        "FormatVersion": "aws_v1",
        "Filters": [
            {"Type": "TERM_MATCH", "Field": "instanceType", "Value": "p3.2xlarge"},
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-east-1"},
            {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
            {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
            {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
            {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
        ],
    }
    assert json.loads(pricing[1].body)["NextToken"] == "eyJ0b2tlbiI6InAyIn0="
    assert "/us-east-1/pricing/" in pricing[0].headers["authorization"]
    # spot: one query per region (two pages in us-east-1), Linux/UNIX, from now on
    ec2 = [parse_qs(s.body.decode()) for s in price_lists.requests("ec2")]
    assert len(ec2) == 4
    assert ec2[0]["ProductDescription.1"] == ["Linux/UNIX"]
    assert sorted(v[0] for k, v in ec2[0].items() if k.startswith("InstanceType.")) == [
        "p3.16xlarge",
        "p3.2xlarge",
        "p3.8xlarge",
        "p3dn.24xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
    ]
    assert "StartTime" in ec2[0]
    assert ec2[1]["NextToken"] == ["9f1c7b0a-page-2"]


def test_aws_without_credentials_is_not_read(
    price_lists: PriceLists, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(PriceListError, match=r"^no credentials \("):
        aws.read(rows("aws"))
    assert price_lists.seen == []


@pytest.mark.parametrize("body", [HTML, b'{"FormatVersion": "aws_v1", "PriceList": ["{\\"pro'])
def test_aws_garbled_price_list_is_one_line(price_lists: PriceLists, body: bytes) -> None:
    price_lists.garbled["pricing"] = body
    with pytest.raises(PriceListError) as info:
        aws.read(rows("aws"))
    message = str(info.value)
    assert message.startswith("the Price List API")
    assert "\n" not in message
    assert len(message) < 320


def test_aws_garbled_spot_history_keeps_the_old_spot_prices(price_lists: PriceLists) -> None:
    price_lists.garbled["ec2"] = HTML
    reading = aws.read(rows("aws"))
    quote = reading.quotes[("p3.2xlarge", "us-east-1")]
    assert (quote.ondemand, quote.spot_read) == (_d("3.06"), False)
    assert len(reading.problems) == 3
    assert reading.problems[0].startswith("spot prices in us-east-1 not read: ")


# --- Azure ------------------------------------------------------------------------------------


def test_azure_reads_consumption_linux_prices_following_next_page_links(
    price_lists: PriceLists,
) -> None:
    reading = azure.read(rows("azure"))
    assert reading.quotes == {
        ("Standard_NC24ads_A100_v4", "eastus"): Quote(_d("3.673"), _d("0.3673")),
        ("Standard_NC48ads_A100_v4", "eastus"): Quote(_d("7.346"), _d("0.7346")),
        ("Standard_NC96ads_A100_v4", "eastus"): Quote(_d("14.692"), _d("1.4692")),
        ("Standard_ND96asr_v4", "eastus"): Quote(_d("27.197"), _d("5.4394")),
        ("Standard_ND96amsr_A100_v4", "eastus"): Quote(_d("32.77"), None),
    }  # Standard_ND40rs_v2: not in the recorded price list; the retired NCv3: not asked
    seen = price_lists.requests("azure")
    assert len(seen) == 6 + 1  # a query per row still sold, and NC24ads' second page
    assert seen[0].path == "/azure/api/retail/prices"
    assert seen[0].query["api-version"] == ["2023-01-01-preview"]
    assert seen[0].query["$filter"] == [
        "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' "
        "and armSkuName eq 'Standard_ND40rs_v2'"
    ]
    nc24 = [s for s in seen if "Standard_NC24ads_A100_v4" in s.query["$filter"][0]]
    assert [s.query.get("$skip") for s in nc24] == [None, ["100"]]


def test_azure_html_page_is_one_line(price_lists: PriceLists) -> None:
    price_lists.garbled["azure"] = HTML
    with pytest.raises(PriceListError) as info:
        azure.read(rows("azure"))
    assert str(info.value) == (
        "the Azure Retail Prices API answered no JSON: a page titled '502 Bad Gateway'"
    )


def test_azure_next_page_link_to_another_site_is_not_followed(price_lists: PriceLists) -> None:
    foreign = {"Items": [], "NextPageLink": "https://example.com/steal?$skip=100"}
    price_lists.garbled["azure"] = json.dumps(foreign).encode()
    with pytest.raises(PriceListError, match="NextPageLink to another site"):
        azure.read(rows("azure"))
    assert len(price_lists.requests("azure")) == 1


# --- GCP --------------------------------------------------------------------------------------

A2_CORE, A2_RAM, A100 = _d("0.031611"), _d("0.004237"), _d("2.933908")
A2_CORE_SPOT, A2_RAM_SPOT, A100_SPOT = _d("0.009483"), _d("0.001271"), _d("1.46695")


def test_gcp_sums_core_ram_and_gpu_skus_of_the_region(price_lists: PriceLists) -> None:
    reading = gcp.read(rows("gcp"))
    quotes = reading.quotes
    assert quotes[("a2-highgpu-1g", "us-central1")] == Quote(_d("3.673385"), _d("1.688781"))
    # the same sums, written out: 12 vCPU, 85 GiB, 1 GPU
    assert _d("3.673385") == 12 * A2_CORE + 85 * A2_RAM + A100
    assert _d("1.688781") == 12 * A2_CORE_SPOT + 85 * A2_RAM_SPOT + A100_SPOT
    assert quotes[("a2-megagpu-16g", "us-central1")] == Quote(_d("55.739504"), _d("26.110128"))
    # A100 80GB has no spot SKU recorded: its spot price is unknown
    assert quotes[("a2-ultragpu-8g", "us-central1")] == Quote(_d("40.221616"), None)
    # n1 + V100 from the second page; "Preemptible ..." (the older name) gives spot
    assert quotes[("n1-highmem-8+1xnvidia-tesla-v100", "us-central1")] == Quote(
        _d("2.953212"), _d("1.091624")
    )
    assert quotes[("n1-highmem-64+8xnvidia-tesla-v100", "us-central1")] == Quote(
        _d("23.625696"), _d("8.732992")
    )
    assert len(quotes) == len(rows("gcp")) == 13
    assert reading.problems == ()
    seen = price_lists.requests("gcp")
    assert [s.path for s in seen] == ["/gcp/v1/services/6F81-5844-456A/skus"] * 2
    assert seen[0].query == {"pageSize": ["5000"], "currencyCode": ["USD"], "key": ["test-api-key"]}
    assert seen[1].query["pageToken"] == ["CkYKQGNvbXB1dGUtZW5naW5lLXNrdXMtcGFnZS0y"]


def test_gcp_with_default_credentials_uses_an_authorized_session(
    price_lists: PriceLists, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CLOUDTRAIN_GCP_API_KEY")
    adc = tmp_path / "service-account.json"
    adc.write_text(json.dumps(_service_account(f"{price_lists.url}/token")))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    reading = gcp.read(rows("gcp"))
    assert reading.quotes[("a2-highgpu-1g", "us-central1")].ondemand == _d("3.673385")
    token, *pages = price_lists.seen
    assert (token.cloud, token.path) == ("token", "/token")
    assert parse_qs(token.body.decode())["grant_type"] == [
        "urn:ietf:params:oauth:grant-type:jwt-bearer"
    ]
    assert [s.cloud for s in pages] == ["gcp", "gcp"]
    assert all(s.headers["authorization"] == f"Bearer {TOKEN}" for s in price_lists.seen[1:])
    assert all("key" not in s.query for s in price_lists.seen[1:])


def _service_account(token_uri: str) -> dict[str, str]:
    """A service-account key file whose token endpoint is the stand-in."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return {
        "type": "service_account",
        "project_id": "test-project",
        "private_key_id": "0123456789abcdef",
        "private_key": pem.decode(),
        "client_email": "prices@test-project.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": token_uri,
    }


def test_gcp_without_credentials_is_not_read(
    price_lists: PriceLists, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CLOUDTRAIN_GCP_API_KEY")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login there
    with pytest.raises(PriceListError, match=r"^no credentials: set CLOUDTRAIN_GCP_API_KEY"):
        gcp.read(rows("gcp"))
    assert price_lists.requests("gcp") == []


def test_gcp_refused_key_and_cut_json_are_one_line(price_lists: PriceLists) -> None:
    price_lists.gcp_key = "another-key"
    with pytest.raises(PriceListError) as info:
        gcp.read(rows("gcp"))
    assert str(info.value) == "the Cloud Billing Catalog API answered HTTP 403: API key not valid."
    price_lists.garbled["gcp"] = CUT
    with pytest.raises(PriceListError) as info:
        gcp.read(rows("gcp"))
    assert str(info.value).startswith("the Cloud Billing Catalog API answered no JSON: starting")
    assert "test-api-key" not in str(info.value)
