//! Scope cursors and continuation tokens: round trip, tampering, purpose separation, key
//! rotation, misbinding and staleness.

use synchro_protocol::token::{
    open, sign, CursorStatus, Keyring, Principal, Purpose, ScopeCursor, ScopeStreamState,
    StaleReason,
};

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn ring(id: &str, byte: u8) -> Keyring {
    Keyring::new(id, &[byte; 32]).unwrap()
}

fn who() -> Principal {
    Principal {
        user_id: "u".into(),
        client_id: "c".into(),
        client_generation: 4,
    }
}

fn cursor() -> ScopeCursor {
    ScopeCursor {
        scope_id: "user:u".into(),
        stream_generation: 1,
        membership_generation: 2,
        retention_generation: 3,
        position: 500,
        schema_hash: [7; 32],
        principal: who(),
        issued_at: "2026-11-30T00:00:00.000000Z".into(),
    }
}

fn state() -> ScopeStreamState {
    ScopeStreamState {
        stream_generation: 1,
        membership_generation: 2,
        retention_generation: 3,
        resume_floor: 100,
        schema_hash: [7; 32],
        bridged: Vec::new(),
    }
}

#[test]
fn cursors_round_trip_and_resume() {
    let k = ring("k1", 1);
    let token = cursor().sign(&k);
    assert!(token.starts_with("c1."));
    let back = ScopeCursor::open(&k, &token).unwrap();
    assert_eq!(back, cursor());
    assert_eq!(
        back.check("user:u", &who(), &state()).unwrap(),
        CursorStatus::Resumable(500)
    );
    // At the floor is still resumable.
    let at_floor = ScopeCursor {
        position: 100,
        ..cursor()
    };
    assert_eq!(
        at_floor.check("user:u", &who(), &state()).unwrap(),
        CursorStatus::Resumable(100)
    );
}

#[test]
fn every_tampering_is_rejected() {
    let k = ring("k1", 1);
    let token = cursor().sign(&k);
    let (prefix, rest) = token.split_once('.').unwrap();
    let (payload, mac) = rest.split_once('.').unwrap();
    let flip = |s: &str, i: usize| {
        let mut b = s.as_bytes().to_vec();
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        String::from_utf8(b).unwrap()
    };
    let forged = [
        format!("{prefix}.{}.{mac}", flip(payload, 10)),
        format!("{prefix}.{payload}.{}", flip(mac, 5)),
        format!("{prefix}.{payload}.{}", &mac[..mac.len() - 2]),
        format!("r1.{payload}.{mac}"),
        format!("{prefix}.{payload}.{mac}.x"),
        format!("{prefix}.{payload}"),
        format!("{prefix}.{payload}={mac}"),
        String::new(),
        "c1..".into(),
        "x".repeat(5000),
    ];
    for t in forged {
        let err = ScopeCursor::open(&k, &t).unwrap_err();
        assert_eq!(err.code(), "invalid_token", "{t}");
    }
    // Another key with the same id does not verify it.
    assert!(ScopeCursor::open(&ring("k1", 2), &token).is_err());
}

#[test]
fn purposes_are_separate() {
    let k = ring("k1", 1);
    let rebuild = sign(Purpose::RebuildContinuation, &k, vec![]);
    assert!(open(Purpose::ScopeCursor, &k, &rebuild).is_err());
    // Same key bytes, relabelled prefix: the purpose-specific MAC domain still rejects it.
    let relabelled = rebuild.replacen("r1.", "c1.", 1);
    assert!(open(Purpose::ScopeCursor, &k, &relabelled).is_err());
    assert!(open(Purpose::RebuildContinuation, &k, &rebuild).is_ok());
}

#[test]
fn keys_rotate_and_retire() {
    let mut k = ring("k1", 1);
    let old = cursor().sign(&k);
    k.add("k2", &[2; 32]).unwrap();
    k.rotate_to("k2").unwrap();
    let new = cursor().sign(&k);
    assert_ne!(old, new);
    assert!(
        ScopeCursor::open(&k, &old).is_ok(),
        "old tokens verify during rotation"
    );
    k.retire("k1");
    assert!(
        ScopeCursor::open(&k, &old).is_err(),
        "retired keys stop verifying"
    );
    assert!(ScopeCursor::open(&k, &new).is_ok());
    assert!(
        Keyring::new("short", &[1; 16]).is_err(),
        "keys are at least 32 bytes"
    );
    assert!(
        !format!("{k:?}").contains("[2, 2"),
        "Debug never prints key material"
    );
}

#[test]
fn misbound_is_an_error_and_obsolete_is_stale() {
    let c = cursor();
    for (scope, w) in [
        ("user:other", who()),
        (
            "user:u",
            Principal {
                user_id: "v".into(),
                ..who()
            },
        ),
        (
            "user:u",
            Principal {
                client_id: "d".into(),
                ..who()
            },
        ),
    ] {
        assert_eq!(
            c.check(scope, &w, &state()).unwrap_err().code(),
            "invalid_token"
        );
    }
    let cases = [
        (
            ScopeStreamState {
                stream_generation: 9,
                ..state()
            },
            StaleReason::Stream,
        ),
        (
            ScopeStreamState {
                membership_generation: 9,
                ..state()
            },
            StaleReason::Membership,
        ),
        (
            ScopeStreamState {
                retention_generation: 9,
                ..state()
            },
            StaleReason::Retention,
        ),
        (
            ScopeStreamState {
                schema_hash: [8; 32],
                ..state()
            },
            StaleReason::Schema,
        ),
        (
            ScopeStreamState {
                resume_floor: 501,
                ..state()
            },
            StaleReason::BelowFloor,
        ),
    ];
    for (s, reason) in cases {
        assert_eq!(
            c.check("user:u", &who(), &s).unwrap(),
            CursorStatus::Stale(reason)
        );
    }
    let newer_client = Principal {
        client_generation: 5,
        ..who()
    };
    assert_eq!(
        c.check("user:u", &newer_client, &state()).unwrap(),
        CursorStatus::Stale(StaleReason::ClientGeneration)
    );
}

/// A lineage reset's bridge (issue 38): a cursor of the earlier stream generation resumes at
/// or below the bridge and is stale beyond it (a history the database no longer has); a
/// generation not on the chain stays stale; every other binding is still checked.
#[test]
fn a_bridged_stream_generation_resumes_only_up_to_its_bridge() {
    let c = cursor(); // stream generation 1, position 500
    let after_reset = |through| ScopeStreamState {
        stream_generation: 1_800_000_000_000_000,
        bridged: vec![(1, through)],
        ..state()
    };
    assert_eq!(
        c.check("user:u", &who(), &after_reset(500)).unwrap(),
        CursorStatus::Resumable(500)
    );
    assert_eq!(
        c.check("user:u", &who(), &after_reset(10_000)).unwrap(),
        CursorStatus::Resumable(500)
    );
    assert_eq!(
        c.check("user:u", &who(), &after_reset(499)).unwrap(),
        CursorStatus::Stale(StaleReason::Stream),
        "a cursor from beyond the surviving history"
    );
    let other_chain = ScopeStreamState {
        bridged: vec![(2, 10_000)],
        ..after_reset(0)
    };
    assert_eq!(
        c.check("user:u", &who(), &other_chain).unwrap(),
        CursorStatus::Stale(StaleReason::Stream)
    );
    let floor_above = ScopeStreamState {
        resume_floor: 501,
        ..after_reset(10_000)
    };
    assert_eq!(
        c.check("user:u", &who(), &floor_above).unwrap(),
        CursorStatus::Stale(StaleReason::BelowFloor)
    );
}
