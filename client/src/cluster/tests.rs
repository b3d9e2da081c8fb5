use super::*;

#[test]
fn placement_is_stable_and_spread() {
    let three = ["a:7070", "b:7070", "c:7070"];
    let mut count = [0usize; 3];
    for m in 0..3000 {
        let model = format!("model-{m}");
        let s = place(&model, &three).unwrap();
        assert_eq!(place(&model, &three), Some(s), "deterministic");
        count[s] += 1;
        // Removing another server never moves this model.
        let others: Vec<&str> = three
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != (s + 1) % 3)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(others[place(&model, &others).unwrap()], three[s]);
    }
    assert!(count.iter().all(|&c| c > 800), "spread: {count:?}");
    assert_eq!(place("m", &[] as &[&str]), None);
}

#[test]
fn a_new_server_takes_about_its_share_of_replicas() {
    let four: Vec<String> = (0..4).map(|i| format!("index-{i}.svc:7070")).collect();
    let mut five = four.clone();
    five.push("index-4.svc:7070".into());
    let models: Vec<String> = (0..4000).map(|m| format!("model-{m}")).collect();
    let (mut moved, mut per_server) = (0usize, [0usize; 5]);
    for m in &models {
        let before = replicas(m, &four, 2);
        assert_eq!(before.len(), 2);
        assert_ne!(before[0], before[1]);
        assert_eq!(before[0], place(m, &four).unwrap());
        // Every gateway computes the same set: it depends on names only.
        let shuffled: Vec<String> = four.iter().rev().cloned().collect();
        let again: Vec<&str> = replicas(m, &shuffled, 2)
            .into_iter()
            .map(|i| shuffled[i].as_str())
            .collect();
        let named: Vec<&str> = before.iter().map(|&i| four[i].as_str()).collect();
        assert_eq!(again, named);
        let after = replicas(m, &five, 2);
        for &s in &after {
            per_server[s] += 1;
        }
        // Only the new server takes replicas; it takes one replica of a
        // model at most, and the others keep theirs.
        let kept = after.iter().filter(|s| before.contains(s)).count();
        assert!(kept >= 1);
        if kept == 1 {
            assert!(after.contains(&4));
            moved += 1;
        }
    }
    // One replica in R·n' = 10 slots moves to the new server: 2/5 of
    // the models lose one replica (each replica slot moves with
    // probability 1/5).
    let share = moved as f64 / models.len() as f64;
    assert!((0.35..0.45).contains(&share), "{share}");
    assert!(per_server.iter().all(|&n| n > 1400), "{per_server:?}");
}

#[test]
fn replica_sets_are_the_top_of_the_ranking() {
    let names = ["a", "b", "c"];
    assert_eq!(replicas("m", &names, 3).len(), 3);
    assert_eq!(replicas("m", &names, 5).len(), 3);
    assert_eq!(replicas("m", &names, 2), replicas("m", &names, 3)[..2]);
    assert!(replicas("m", &[] as &[&str], 2).is_empty());
}
