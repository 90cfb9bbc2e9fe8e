//! The API over real TCP, with a client that speaks HTTP/1.1 by hand so the
//! tests depend on nothing but the wire format.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// (status, body) of one request on a connection of its own.
async fn call(service: &OrderService, method: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(service.address())
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: orders\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

async fn sample() -> OrderService {
    OrderService::start([
        Order::new("o-1", Status::Pending),
        Order::new("o-2", Status::Paid),
        Order::new("o-3", Status::Pending).flaky(2),
        Order::new("o-4", Status::Refunded),
        Order::new("o-5", Status::Pending).down(),
        Order::new("o/6 é", Status::Pending),
    ])
    .await
    .unwrap()
}

#[tokio::test]
async fn closes_a_pending_order_and_answers_the_same_when_asked_again() {
    let service = sample().await;
    let closed = (200, r#"{"order_id":"o-1","status":"closed"}"#.to_string());
    assert_eq!(call(&service, "POST", "/orders/o-1/close").await, closed);
    assert_eq!(service.status("o-1"), Some(Status::Closed));
    assert_eq!(call(&service, "POST", "/orders/o-1/close").await, closed);
    assert_eq!(call(&service, "GET", "/orders/o-1").await, closed);
}

#[tokio::test]
async fn a_paid_or_refunded_order_is_a_conflict_that_names_its_status() {
    let service = sample().await;
    assert_eq!(
        call(&service, "POST", "/orders/o-2/close").await,
        (409, r#"{"order_id":"o-2","status":"paid"}"#.to_string())
    );
    assert_eq!(
        call(&service, "POST", "/orders/o-4/close").await,
        (409, r#"{"order_id":"o-4","status":"refunded"}"#.to_string())
    );
    assert_eq!(service.status("o-2"), Some(Status::Paid));
}

#[tokio::test]
async fn a_flaky_order_fails_twice_then_closes_and_a_down_one_never_does() {
    let service = sample().await;
    let statuses = |n| {
        let service = &service;
        async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(call(service, "POST", "/orders/o-3/close").await.0);
            }
            out
        }
    };
    assert_eq!(statuses(3).await, [503, 503, 200]);
    for _ in 0..4 {
        assert_eq!(call(&service, "POST", "/orders/o-5/close").await.0, 503);
    }
    // A read is not a close: the fault does not apply.
    assert_eq!(call(&service, "GET", "/orders/o-5").await.0, 200);
    assert_eq!(service.status("o-5"), Some(Status::Pending));
}

#[tokio::test]
async fn unknown_orders_bad_paths_and_wrong_methods_are_refused_by_name() {
    let service = sample().await;
    assert_eq!(
        call(&service, "POST", "/orders/o-9/close").await,
        (404, r#"{"error":"no order o-9"}"#.to_string())
    );
    assert_eq!(call(&service, "GET", "/nothing").await.0, 404);
    assert_eq!(call(&service, "GET", "/orders/o-1/close").await.0, 405);
    assert_eq!(call(&service, "DELETE", "/orders/o-1").await.0, 405);
    assert_eq!(call(&service, "POST", "/orders").await.0, 405);
    let (status, body) = call(&service, "POST", "/orders/o%zz/close").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("o%zz"), "{body}");
    // Not UTF-8 once decoded.
    assert_eq!(call(&service, "POST", "/orders/o%ff/close").await.0, 400);
    assert_eq!(service.status("o-1"), Some(Status::Pending));
}

#[tokio::test]
async fn an_order_id_is_one_percent_encoded_segment() {
    let service = sample().await;
    let (status, body) = call(&service, "POST", "/orders/o%2F6%20%C3%A9/close").await;
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"order_id":"o/6 é","status":"closed"}"#)
    );
    // A raw slash makes it two segments, which is no resource.
    assert_eq!(call(&service, "POST", "/orders/o/6/close").await.0, 404);
}

#[tokio::test]
async fn every_request_is_recorded_and_the_list_shows_every_order() {
    let service = sample().await;
    let (status, body) = call(&service, "GET", "/orders").await;
    assert_eq!(status, 200);
    let list: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(list.len(), 6);
    call(&service, "POST", "/orders/o-9/close").await;
    let served = service.served();
    assert_eq!(served.len(), 2);
    assert_eq!(
        served[1],
        Served {
            method: "POST".into(),
            path: "/orders/o-9/close".into(),
            status: 404
        }
    );
}

#[tokio::test]
async fn refuses_to_listen_beyond_loopback_and_stops_when_dropped() {
    let outside = SocketAddr::from(([0, 0, 0, 0], 0));
    let err = OrderService::bind(outside, []).await.err().unwrap();
    assert!(err.to_string().contains("0.0.0.0"), "{err}");

    let service = sample().await;
    let address = service.address();
    drop(service);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(address).await.is_err());
}
