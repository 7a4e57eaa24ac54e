from qproxy_tools.bench import callgrind

# callgrind_annotate --inclusive=no: each function's own instructions.
ANNOTATED = """--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
2,000,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                  file:function
--------------------------------------------------------------------------------
  600,000 (30.00%)  ???:qproxy_transport::server::parse::read_head [/qproxy]
  300,000 (15.00%)  ???:httparse::parse_headers [/qproxy]
  250,000 (12.50%)  ???:tokio::runtime::task::raw::poll [/qproxy]
  200,000 (10.00%)  ???:memcpy [/lib/libc.so.6]
  150,000 ( 7.50%)  ???:qproxy_observe::request_metrics::record [/qproxy]
  120,000 ( 6.00%)  ???:qproxy_core::facts::facts [/qproxy]
  100,000 ( 5.00%)  ???:qproxy::stack::PortState::serve [/qproxy]
   80,000 ( 4.00%)  ???:something_else [/qproxy]
"""


def test_each_function_counts_in_its_first_matching_part():
    parts = callgrind.parts_of(ANNOTATED)
    assert parts["the client's head read and parsed"] == 900_000
    assert parts["tokio"] == 250_000
    assert parts["memcpy, the allocator"] == 200_000
    assert parts["request metrics"] == 150_000
    # The crates every layer shares count as the layers.
    assert parts["the layers"] == 220_000
    assert parts["other"] == 80_000
    assert sum(parts.values()) == 1_800_000


def test_the_totals_line_is_not_a_function():
    assert "PROGRAM TOTALS" not in str(callgrind.parts_of(ANNOTATED))
    assert callgrind.parts_of("2,000 (100.0%)  PROGRAM TOTALS\n") == {}


def test_the_counted_requests_are_load_1_and_grpc():
    assert callgrind.COUNTED_REQUESTS == ("load 1", "gRPC unary")


def test_the_shared_body_framing_counts_with_the_role_that_uses_it():
    annotated = """
  1,000 ( 1.00%)  ???:qproxy_transport::server::encode::WriteQueue::data [/qproxy]
    300 ( 0.30%)  ???:qproxy_transport::wire::framing::Encoder::encode [/qproxy]
    200 ( 0.20%)  ???:<qproxy_transport::wire::framing::Decoder>::decode [/qproxy]
    100 ( 0.10%)  ???:qproxy_transport::client::body::ResponseBody::finish [/qproxy]
     50 ( 0.05%)  ???:qproxy_transport::wire::chunked::decode [/qproxy]
"""
    parts = callgrind.parts_of(annotated)
    assert parts["the response head written"] == 1_300
    assert parts["the exchange with the app"] == 300
    assert parts["the connections' loops"] == 50
