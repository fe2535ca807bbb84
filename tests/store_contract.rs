//! One contract, two stores: the embedded SQLite file and DynamoDB (on a moto server, with
//! the table built from `template.yaml`).

mod common;

use std::sync::Arc;

use common::{StoreKind, open_store};
use kernelbot_dispatch::discord::DiscordTarget;
use kernelbot_dispatch::jobs::{BuildRef, Created, Job, JobState, JobStore, RunId, Transition};
use kernelbot_dispatch::result::{EvalResult, FullResult, Outcome, RunResult};

fn job(id: &str, created_at: i64) -> Job {
    let discord = DiscordTarget::parse(
        "https://discord.com/api/webhooks/1/secret-token",
        Some("42"),
    )
    .unwrap();
    Job::new(
        id.parse().unwrap(),
        "H100_BK".into(),
        "h100".into(),
        Some("t".into()),
        Some(discord),
        created_at,
    )
}

fn id(s: &str) -> RunId {
    s.parse().unwrap()
}

fn build() -> BuildRef {
    BuildRef {
        id: "b-1".into(),
        number: 7,
        web_url: "https://buildkite.com/o/p/builds/7".into(),
    }
}

pub async fn create_is_idempotent(store: Arc<dyn JobStore>) {
    let j = job("c1", 1_000);
    assert_eq!(store.create(&j).await.unwrap(), Created::New);
    let mut other = job("c1", 2_000);
    other.gpu = "B200_BK".into();
    match store.create(&other).await.unwrap() {
        Created::Existing(existing) => assert_eq!(*existing, j, "the first job is kept unchanged"),
        Created::New => panic!("a second job with the same run id was created"),
    }
    assert_eq!(store.get(&id("c1")).await.unwrap(), Some(j));
    assert_eq!(store.get(&id("missing")).await.unwrap(), None);
}

pub async fn advance_moves_forward_only(store: Arc<dyn JobStore>) {
    store.create(&job("a1", 1_000)).await.unwrap();
    let scheduled = store
        .advance(
            &id("a1"),
            &Transition::to(JobState::Scheduled, 2_000).with_build(build()),
        )
        .await
        .unwrap()
        .expect("forward");
    assert_eq!(
        (
            scheduled.state,
            scheduled.build.clone(),
            scheduled.updated_at
        ),
        (JobState::Scheduled, Some(build()), 2_000)
    );
    assert!(
        store
            .advance(&id("a1"), &Transition::to(JobState::Scheduled, 3_000))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .advance(&id("a1"), &Transition::to(JobState::Submitted, 3_000))
            .await
            .unwrap()
            .is_none()
    );
    let outcome = Outcome::judge(
        "passed",
        Some(FullResult {
            success: true,
            ..Default::default()
        }),
        None,
    );
    let finished = store
        .advance(
            &id("a1"),
            &Transition::to(JobState::Finished, 4_000).with_outcome(outcome.clone()),
        )
        .await
        .unwrap()
        .expect("forward");
    assert_eq!(finished.outcome, Some(outcome));
    assert!(
        store
            .advance(&id("a1"), &Transition::to(JobState::Failed, 5_000))
            .await
            .unwrap()
            .is_none()
    );
    let stored = store.get(&id("a1")).await.unwrap().unwrap();
    assert_eq!(stored, finished);
    assert!(
        store
            .advance(&id("nobody"), &Transition::to(JobState::Running, 1))
            .await
            .unwrap()
            .is_none()
    );
}

pub async fn concurrent_advances_have_one_winner(store: Arc<dyn JobStore>) {
    store.create(&job("race", 1_000)).await.unwrap();
    let tries = (0..8).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .advance(&id("race"), &Transition::to(JobState::Finished, 2_000 + i))
                .await
        })
    });
    let mut winners = 0;
    for t in tries {
        if t.await.unwrap().unwrap().is_some() {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

pub async fn large_results_round_trip(store: Arc<dyn JobStore>) {
    store.create(&job("big", 1_000)).await.unwrap();
    let mut result = FullResult {
        success: true,
        ..Default::default()
    };
    for name in ["test", "benchmark", "leaderboard"] {
        let run = RunResult {
            stdout: "line of benchmark output\n".repeat(600),
            ..Default::default()
        };
        result.runs.insert(
            name.into(),
            EvalResult {
                run: Some(run),
                ..Default::default()
            },
        );
    }
    let outcome = Outcome::judge("passed", Some(result), None);
    store
        .advance(
            &id("big"),
            &Transition::to(JobState::Finished, 2_000).with_outcome(outcome.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        store.get(&id("big")).await.unwrap().unwrap().outcome,
        Some(outcome)
    );
}

pub async fn discord_bookkeeping(store: Arc<dyn JobStore>) {
    store.create(&job("d1", 1_000)).await.unwrap();
    assert!(
        store
            .set_discord_message(&id("d1"), "m-1")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .set_discord_message(&id("d1"), "m-2")
            .await
            .unwrap()
            .is_none(),
        "the first message id is kept"
    );
    store.mark_discord_gone(&id("d1")).await.unwrap();
    let j = store.get(&id("d1")).await.unwrap().unwrap();
    assert_eq!(
        (j.discord_message_id.as_deref(), j.discord_gone),
        (Some("m-1"), true)
    );
    assert_eq!(j.discord.unwrap().thread_id.as_deref(), Some("42"));
    assert!(
        store
            .set_discord_message(&id("nobody"), "m")
            .await
            .unwrap()
            .is_none()
    );
}

pub async fn open_jobs_are_listed_oldest_first(store: Arc<dyn JobStore>) {
    for (name, at) in [
        ("o3", 3_000),
        ("o1", 1_000),
        ("o2", 2_000),
        ("young", 9_000),
        ("done", 500),
    ] {
        store.create(&job(name, at)).await.unwrap();
    }
    store
        .advance(&id("o2"), &Transition::to(JobState::Running, 4_000))
        .await
        .unwrap();
    store
        .advance(&id("done"), &Transition::to(JobState::Finished, 4_000))
        .await
        .unwrap();
    let open: Vec<String> = store
        .list_open(5_000, 10)
        .await
        .unwrap()
        .iter()
        .map(|j| j.run_id.to_string())
        .collect();
    assert_eq!(open, ["o1", "o2", "o3"]);
    assert_eq!(store.list_open(5_000, 2).await.unwrap().len(), 2);
}

macro_rules! contract {
    ($kind:expr) => {
        use super::*;
        #[tokio::test]
        async fn create_is_idempotent_per_run_id() {
            let (s, _d) = open_store($kind).await;
            create_is_idempotent(s).await
        }
        #[tokio::test]
        async fn advance_only_moves_forward() {
            let (s, _d) = open_store($kind).await;
            advance_moves_forward_only(s).await
        }
        #[tokio::test]
        async fn concurrent_advances_have_exactly_one_winner() {
            let (s, _d) = open_store($kind).await;
            concurrent_advances_have_one_winner(s).await
        }
        #[tokio::test]
        async fn large_results_survive_the_round_trip() {
            let (s, _d) = open_store($kind).await;
            large_results_round_trip(s).await
        }
        #[tokio::test]
        async fn discord_message_ids_are_set_once() {
            let (s, _d) = open_store($kind).await;
            discord_bookkeeping(s).await
        }
        #[tokio::test]
        async fn only_unfinished_jobs_are_listed_for_the_sweep() {
            let (s, _d) = open_store($kind).await;
            open_jobs_are_listed_oldest_first(s).await
        }
    };
}

mod sqlite {
    contract!(StoreKind::Sqlite);

    #[tokio::test]
    async fn two_processes_share_one_file() {
        // Two stores on one directory stand for two local function processes.
        let dir = tempfile::tempdir().unwrap();
        let a = kernelbot_dispatch::jobs::sqlite::SqliteStore::open(dir.path()).unwrap();
        let b = kernelbot_dispatch::jobs::sqlite::SqliteStore::open(dir.path()).unwrap();
        a.create(&job("shared", 1)).await.unwrap();
        assert!(
            b.advance(&id("shared"), &Transition::to(JobState::Running, 2))
                .await
                .unwrap()
                .is_some()
        );
        assert_eq!(
            a.get(&id("shared")).await.unwrap().unwrap().state,
            JobState::Running
        );
    }
}

mod dynamodb {
    contract!(StoreKind::Dynamo);
}
